//! HTML building for the web view: escaping and the page frame.
//!
//! Every string that did not come from this file goes through [`esc`]
//! (schedule names, payloads, error texts, even values belfry validated,
//! since rows can be edited by hand). Pages are plain server-rendered HTML;
//! `ui.js` only refreshes `<main>` in place.

use std::fmt::Write as _;

/// `text` escaped for HTML element content and quoted attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` percent-encoded for a URL path segment or query value (the
/// API's one rule, shared with the CLI).
pub use belfry_api_types::encode_url_component as url;

/// The sections of the navigation bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// `/ui`.
    Overview,
    /// `/ui/schedules`.
    Schedules,
    /// `/ui/runs`.
    Runs,
    /// Nothing highlighted (login, errors).
    None,
}

/// A whole page: `body` inside the frame. `refresh` lets `ui.js` reload
/// `<main>` every few seconds; `who` names the signed-in token.
pub fn page(title: &str, section: Section, who: Option<&str>, refresh: bool, body: &str) -> String {
    let link = |href: &str, label: &str, s: Section| {
        format!(
            "<a href=\"{href}\"{}>{label}</a>",
            if s == section { " class=\"on\"" } else { "" }
        )
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · belfry</title><link rel=\"stylesheet\" href=\"/ui/assets/ui.css\">\
         <script src=\"/ui/assets/ui.js\" defer></script></head><body>\
         <header><a class=\"brand\" href=\"/ui\">belfry</a>{}{}{}<span class=\"who\">{}</span>\
         <form method=\"post\" action=\"/ui/logout\"><button>sign out</button></form></header>\
         <main{}>{body}</main></body></html>",
        link("/ui", "Overview", Section::Overview),
        link("/ui/schedules", "Schedules", Section::Schedules),
        link("/ui/runs", "Runs", Section::Runs),
        who.map(|w| format!("signed in as {}", esc(w)))
            .unwrap_or_default(),
        if refresh { " data-refresh" } else { "" },
        title = esc(title),
    )
}

/// A table of `rows` (already HTML) under `headers`.
pub fn table(headers: &[&str], rows: &[String]) -> String {
    let mut out = String::from("<table><thead><tr>");
    for h in headers {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    if rows.is_empty() {
        let _ = write!(
            out,
            "<tr><td colspan=\"{}\" class=\"muted\">nothing here</td></tr>",
            headers.len()
        );
    }
    for r in rows {
        out.push_str(r);
    }
    out.push_str("</tbody></table>");
    out
}

/// An optional instant as text (`-` when absent).
pub fn when(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f").to_string())
        .unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc("<script>alert('x') & \"y\"</script>"),
            "&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;y&quot;&lt;/script&gt;"
        );
        let p = page("<t>", Section::Runs, Some("<me>"), true, "<p>ok</p>");
        assert!(p.contains("&lt;t&gt; · belfry") && p.contains("signed in as &lt;me&gt;"));
        assert!(p.contains("<main data-refresh><p>ok</p></main>"));
    }
}
