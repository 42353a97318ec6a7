//! Glob patterns on schedule and job names in alert routes: `*` matches
//! any run of characters (none included), `?` one character, anything
//! else itself. `nightly-*` matches `nightly-billing`; `*` matches all.

/// A compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamePattern {
    pattern: Vec<char>,
}

impl NamePattern {
    /// The pattern `text`.
    pub fn new(text: &str) -> Self {
        Self {
            pattern: text.chars().collect(),
        }
    }

    /// Whether `name` matches. Linear in the lengths (the classic
    /// two-pointer match with backtracking to the last `*` only), so a
    /// hostile pattern cannot make routing slow.
    pub fn matches(&self, name: &str) -> bool {
        let name: Vec<char> = name.chars().collect();
        let p = &self.pattern;
        let (mut i, mut j) = (0, 0);
        // Where the last `*` was, and where in `name` it started matching.
        let mut star: Option<(usize, usize)> = None;
        while i < name.len() {
            if j < p.len() && (p[j] == '?' || p[j] == name[i]) {
                i += 1;
                j += 1;
            } else if j < p.len() && p[j] == '*' {
                star = Some((j, i));
                j += 1;
            } else if let Some((sj, si)) = star {
                // Let the last `*` take one more character.
                j = sj + 1;
                i = si + 1;
                star = Some((sj, si + 1));
            } else {
                return false;
            }
        }
        p[j..].iter().all(|c| *c == '*')
    }
}

impl std::fmt::Display for NamePattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.pattern.iter().collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::NamePattern;

    #[test]
    fn globs_match_as_documented() {
        let m = |p: &str, n: &str| NamePattern::new(p).matches(n);
        assert!(m("nightly-*", "nightly-billing"));
        assert!(m("nightly-*", "nightly-"));
        assert!(!m("nightly-*", "hourly-billing"));
        assert!(m("*", ""));
        assert!(m("*-report", "daily-sales-report"));
        assert!(!m("*-report", "daily-sales-reports"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "ac"));
        assert!(m("exact", "exact"));
        assert!(!m("exact", "exactly"));
        assert!(m("*a*b*", "xxaxxbxx"));
        assert!(!m("*a*b*", "xxbxxaxx"));
        // Pathological pattern: answers at once.
        let long = "a".repeat(5000);
        assert!(!m(&"*a".repeat(50), &format!("{long}b")));
    }
}
