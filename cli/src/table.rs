//! Human output: aligned columns, one row per item.

/// Formats one row per item of `items` (the cells `row` makes of it) under
/// `headers`.
pub fn render_each<T>(headers: &[&str], items: &[T], row: impl Fn(&T) -> Vec<String>) -> String {
    let rows: Vec<Vec<String>> = items.iter().map(row).collect();
    render(headers, &rows)
}

/// Formats `rows` under `headers`, each column as wide as its widest cell.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                s.push_str(cell);
                s.push_str(&" ".repeat(pad + 2));
            }
        }
        s.trim_end().to_owned()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// Text as a table cell: control characters escaped so a cell cannot
/// break the layout.
pub fn cell(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// An optional value as a cell: `-` when absent.
pub fn maybe(value: Option<impl std::fmt::Display>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| cell(&v.to_string()))
}

/// An instant as the API writes it (RFC 3339, `Z`).
pub fn instant(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let out = render(
            &["NAME", "KIND"],
            &[
                vec!["a".into(), "cron".into()],
                vec!["long-name".into(), "every".into()],
            ],
        );
        assert_eq!(out, "NAME       KIND\na          cron\nlong-name  every\n");
        assert_eq!(maybe(None::<&str>), "-");
        assert_eq!(cell("two\nlines"), "two\\nlines");
    }
}
