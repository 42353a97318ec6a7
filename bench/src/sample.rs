//! Summaries of a benchmark's rounds. Every benchmark reports the median of
//! its rounds (the machine is shared and noisy; a mean would carry one slow
//! round into the number), so the one definition lives here.

/// The median of `v` (the upper one of an even count); `NaN` for no rounds.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `(p50, p99, max)` of `v` (nearest rank); `NaN` for no samples.
pub fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| {
        v.get(((v.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(f64::NAN)
    };
    (at(0.5), at(0.99), v.last().copied().unwrap_or(f64::NAN))
}
