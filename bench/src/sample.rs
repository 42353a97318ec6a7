//! Summaries of a benchmark's rounds. Every benchmark reports the median of
//! its rounds (the machine is shared and noisy; a mean would carry one slow
//! round into the number), so the one definition lives here.

/// The median of `v` (the upper one of an even count); `NaN` for no rounds.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
