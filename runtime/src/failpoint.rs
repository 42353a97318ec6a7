//! Named crash points for fault tests.
//!
//! Code calls [`hit`] at the places where a crash is most dangerous (after a
//! claim and before its publish, after a publish and before it is recorded,
//! inside a handler, before an ack). In normal builds `hit` is an empty
//! inline function: zero cost. Built with the `failpoints` feature
//! (`cargo test --features belfry-runtime/failpoints`, which `scripts/test`
//! does), a point is armed through the environment:
//!
//! ```text
//! BELFRY_FAILPOINTS="after_claim_before_publish=abort,before_ack=abort"
//! ```
//!
//! `abort` kills the process on the spot (like `kill -9`: no destructors, no
//! flush); `panic` panics the calling task. Unarmed points do nothing.
//!
//! | point | where |
//! | --- | --- |
//! | `after_claim_before_publish` | scheduler: the fire's row is inserted, nothing published |
//! | `after_publish_before_dispatched` | dispatch: the broker confirmed, the row still `claimed` |
//! | `inside_handler` | worker: the attempt is counted, the handler starts |
//! | `before_ack` | worker: the outcome is recorded, the delivery not acked |

/// The environment variable that arms failpoints.
pub const ENV: &str = "BELFRY_FAILPOINTS";

/// Triggers the failpoint `name` if it is armed (only in `failpoints`
/// builds; otherwise does nothing).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// Triggers the failpoint `name` if it is armed.
///
/// # Panics
///
/// When `name` is armed with `panic`.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    use std::collections::HashMap;
    use std::sync::OnceLock;
    static ARMED: OnceLock<HashMap<String, String>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| {
        std::env::var(ENV)
            .unwrap_or_default()
            .split(',')
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect()
    });
    match armed.get(name).map(String::as_str) {
        Some("abort") => {
            eprintln!("failpoint {name}: aborting the process");
            std::process::abort();
        }
        Some("panic") => panic!("failpoint {name}"),
        _ => {}
    }
}
