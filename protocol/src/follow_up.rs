//! Follow-up jobs: runs enqueued when another run ends.
//!
//! A run may carry three lists in its options — `on_success`, `on_failure`
//! (`failed` or `dead`) and `on_finish` (any end, `cancelled` included).
//! When the run reaches such an end, each listed follow-up becomes a run of
//! its own through the normal claim path. Its run key is derived from the
//! parent's: `{follow-up name}@{the parent's run key identity}` (the part
//! after `@`, the fire instant of a scheduled run), a pure function of the
//! parent, so however often the parent's end is seen (a redelivered
//! message, a retried outcome write, two scheduler replicas looking at
//! once) the unique run key admits one child.
//!
//! A follow-up with `after = ["extract-b"]` waits for several parents: it
//! runs once every named job's run with the same identity has succeeded
//! too (`extract-b@2026-07-26T02:00:00Z` for a parent fired at that
//! instant). Since the child's key is the same whichever parent saw it
//! first, the parents can list it all, or only one of them.
//!
//! The child carries the parents' outcome (see [`ParentRun`]) in its
//! options, and its parent's trace.

use serde::{Deserialize, Serialize};
use thiserror::Error;
use uuid::Uuid;

use crate::{validate_name, JobOptions, RetrySpec};

/// Most follow-ups of one run, in all three lists together.
pub const MAX_FOLLOW_UPS: usize = 16;
/// Most other parents one follow-up may wait for (`after`).
pub const MAX_AFTER: usize = 8;
/// Deepest nesting of follow-ups of follow-ups.
pub const MAX_DEPTH: usize = 8;
/// Most follow-ups in one run's whole tree (nested ones included).
pub const MAX_TREE: usize = 64;

/// The follow-ups of a run, by the end that enqueues them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FollowUps {
    /// Enqueued when the run succeeds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on_success: Vec<FollowUp>,
    /// Enqueued when the run ends `failed` or `dead`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on_failure: Vec<FollowUp>,
    /// Enqueued whatever the run's end (`cancelled` too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on_finish: Vec<FollowUp>,
}

/// One follow-up: the run to enqueue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FollowUp {
    /// The child's job name (its run key is `{job_name}@{parent identity}`).
    pub job_name: String,
    /// The child's job type.
    pub job_type: String,
    /// The child's payload.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub payload: serde_json::Value,
    /// Other jobs whose run with the same identity must have succeeded too
    /// before the child runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    /// The child's own options (retry, timeout, priority, its follow-ups).
    #[serde(default, skip_serializing_if = "JobOptions::is_empty")]
    pub options: JobOptions,
}

/// A parent of a follow-up run, as the child sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRun {
    /// The parent run's id.
    pub id: Uuid,
    /// Its job name.
    pub job_name: String,
    /// Its run key.
    pub run_key: String,
    /// The status it ended with (`succeeded`, `failed`, `dead`, `cancelled`).
    pub status: String,
    /// Its last error, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its result, if its handler set one (`JobContext::set_result` in the
    /// worker; only a succeeded run has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

/// Which end a follow-up list is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowOn {
    /// `on_success`.
    Success,
    /// `on_failure`.
    Failure,
    /// `on_finish`.
    Finish,
}

impl FollowOn {
    /// The list's name as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "on_success",
            Self::Failure => "on_failure",
            Self::Finish => "on_finish",
        }
    }
}

/// An entry of a follow-up tree: its route from the root (the list and
/// the index taken at each level), its field path and its name.
type Entry<'a> = (Vec<(FollowOn, usize)>, String, &'a str);

/// A follow-up list that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field}: {reason}")]
pub struct InvalidFollowUp {
    /// Where (`on_success[0].job_name`).
    pub field: String,
    /// What is wrong, and what is allowed.
    pub reason: String,
}

impl InvalidFollowUp {
    /// The list the broken entry is in, as a request's field names it
    /// (`on_success`, `on_failure` or `on_finish`; `on_success` for what
    /// concerns the run's lists as a whole).
    pub fn list(&self) -> &'static str {
        [FollowOn::Failure, FollowOn::Finish]
            .into_iter()
            .map(FollowOn::as_str)
            .find(|l| self.field.starts_with(l))
            .unwrap_or(FollowOn::Success.as_str())
    }
}

impl crate::JobOptions {
    /// Checks a received run's follow-up lists against its job name
    /// ([`FollowUps::validate`]) and its `parents` ([`check_parents`]).
    ///
    /// # Errors
    ///
    /// [`InvalidFollowUp`] naming what is wrong.
    pub fn check_follow_ups(&self, job_name: &str) -> Result<(), InvalidFollowUp> {
        self.follow_ups.validate(job_name)?;
        check_parents(&self.parents)
    }
}

impl FollowUps {
    /// True when no list has an entry.
    pub fn is_empty(&self) -> bool {
        self.on_success.is_empty() && self.on_failure.is_empty() && self.on_finish.is_empty()
    }

    /// The lists with their names.
    pub fn lists(&self) -> [(FollowOn, &[FollowUp]); 3] {
        [
            (FollowOn::Success, &self.on_success),
            (FollowOn::Failure, &self.on_failure),
            (FollowOn::Finish, &self.on_finish),
        ]
    }

    /// The follow-ups a run ending with `status` enqueues: `on_success` for
    /// `succeeded`, `on_failure` for `failed` and `dead`, `on_finish` for
    /// every end. Nothing for a status that is not an end.
    pub fn for_status(&self, status: &str) -> Vec<&FollowUp> {
        let first: &[FollowUp] = match status {
            "succeeded" => &self.on_success,
            "failed" | "dead" => &self.on_failure,
            "cancelled" => &[],
            _ => return Vec::new(),
        };
        first.iter().chain(&self.on_finish).collect()
    }

    /// Checks the lists of a run of `parent` (its job name): names and
    /// types follow the naming rule, a child is never named as its parent
    /// (its key would be the parent's own), a child name appears once among
    /// the follow-ups one end enqueues, `after` names other jobs, at most
    /// [`MAX_FOLLOW_UPS`] entries, [`MAX_AFTER`] parents and [`MAX_DEPTH`]
    /// levels, and every payload is storable.
    ///
    /// # Errors
    ///
    /// [`InvalidFollowUp`] naming the entry and the broken rule.
    pub fn validate(&self, parent: &str) -> Result<(), InvalidFollowUp> {
        self.validate_at(parent, "", 1)?;
        // Every run of the tree shares the root's identity, so two entries
        // of one name that can both be enqueued (one below the other, or
        // side by side under ends that can both happen) would be one run:
        // the second silently not enqueued. Refused instead.
        let mut nodes: Vec<Entry<'_>> = vec![(Vec::new(), String::new(), parent)];
        self.collect(&mut Vec::new(), "", &mut nodes);
        if nodes.len() > MAX_TREE + 1 {
            return Err(InvalidFollowUp {
                field: "on_success".into(),
                reason: format!(
                    "{} follow-ups in the whole tree; at most {MAX_TREE}",
                    nodes.len() - 1
                ),
            });
        }
        for (j, (route, at, name)) in nodes.iter().enumerate().skip(1) {
            for (other, other_at, other_name) in &nodes[..j] {
                if name == other_name && !exclusive(other, route) {
                    let first = if other_at.is_empty() {
                        "the parent".to_owned()
                    } else {
                        other_at.clone()
                    };
                    return Err(InvalidFollowUp {
                        field: format!("{at}.job_name"),
                        reason: format!(
                            "{name:?} is also {first}, and both would be enqueued from one run \
                             (one run per name and identity); give each follow-up a name of its own \
                             (only the same name under on_success and on_failure of one run is allowed)"
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Every entry of the tree with its route (the `(depth, end)` steps
    /// from the root), its field path and its name.
    fn collect<'a>(
        &'a self,
        route: &mut Vec<(FollowOn, usize)>,
        path: &str,
        out: &mut Vec<Entry<'a>>,
    ) {
        if out.len() > MAX_TREE + 1 {
            return;
        }
        for (on, list) in self.lists() {
            for (i, f) in list.iter().enumerate() {
                let at = format!("{path}{}[{i}]", on.as_str());
                route.push((on, i));
                out.push((route.clone(), at.clone(), &f.job_name));
                f.options
                    .follow_ups
                    .collect(route, &format!("{at}.options.follow_ups."), out);
                route.pop();
            }
        }
    }

    fn validate_at(&self, parent: &str, path: &str, depth: usize) -> Result<(), InvalidFollowUp> {
        let count = self.on_success.len() + self.on_failure.len() + self.on_finish.len();
        if count == 0 {
            return Ok(());
        }
        let invalid = |field: String, reason: String| InvalidFollowUp { field, reason };
        if depth > MAX_DEPTH {
            return Err(invalid(
                path.trim_end_matches('.').to_owned(),
                format!("follow-ups are nested more than {MAX_DEPTH} levels deep"),
            ));
        }
        if count > MAX_FOLLOW_UPS {
            return Err(invalid(
                format!("{path}on_success"),
                format!("{count} follow-ups; at most {MAX_FOLLOW_UPS} per run"),
            ));
        }
        for (on, list) in self.lists() {
            for (i, f) in list.iter().enumerate() {
                let at = format!("{path}{}[{i}]", on.as_str());
                f.validate(parent, &at, depth)?;
            }
        }
        Ok(())
    }
}

impl FollowUp {
    fn validate(&self, parent: &str, at: &str, depth: usize) -> Result<(), InvalidFollowUp> {
        let invalid = |field: &str, reason: String| InvalidFollowUp {
            field: format!("{at}.{field}"),
            reason,
        };
        validate_name("job name", &self.job_name)
            .map_err(|e| invalid("job_name", e.to_string()))?;
        validate_name("job type", &self.job_type)
            .map_err(|e| invalid("job_type", e.to_string()))?;
        if self.job_name == parent {
            return Err(invalid(
                "job_name",
                format!("{parent:?} is the parent's own name; a follow-up needs a name of its own (its run key would be the parent's)"),
            ));
        }
        if self.after.len() > MAX_AFTER {
            return Err(invalid(
                "after",
                format!("{} parents; at most {MAX_AFTER}", self.after.len()),
            ));
        }
        for (i, p) in self.after.iter().enumerate() {
            validate_name("job name", p)
                .map_err(|e| invalid(&format!("after[{i}]"), e.to_string()))?;
            if p == parent || p == &self.job_name || self.after[..i].contains(p) {
                return Err(invalid(
                    &format!("after[{i}]"),
                    format!("{p:?} is the parent itself, the follow-up, or listed twice; name the other jobs it waits for"),
                ));
            }
        }
        crate::check_storable_json("payload", &self.payload)
            .map_err(|e| invalid("payload", e.to_string()))?;
        self.options
            .follow_ups
            .validate_at(&self.job_name, &format!("{at}.options."), depth + 1)
    }

    /// The child's run key for a parent of `parent_job` with `parent_key`:
    /// `{job_name}@{the parent key's identity}`; `None` when the parent key
    /// is not `{parent_job}@{identity}`.
    pub fn child_run_key(&self, parent_job: &str, parent_key: &str) -> Option<String> {
        identity_of(parent_job, parent_key).map(|id| format!("{}@{id}", self.job_name))
    }

    /// The run keys of the other parents it waits for, for a parent of
    /// `parent_job` with `parent_key`.
    pub fn other_parent_keys(&self, parent_job: &str, parent_key: &str) -> Vec<(String, String)> {
        let Some(id) = identity_of(parent_job, parent_key) else {
            return Vec::new();
        };
        self.after
            .iter()
            .map(|p| (p.clone(), format!("{p}@{id}")))
            .collect()
    }
}

/// Whether the entries at `a` and `b` (routes from the root: the list and
/// the index taken at each level) can never both be enqueued: they part at
/// one run, one under its `on_success`, the other under its `on_failure`.
/// Entries that part as two entries of one list, or one below the other
/// (or the root), are both enqueued.
fn exclusive(a: &[(FollowOn, usize)], b: &[(FollowOn, usize)]) -> bool {
    // Every step before the first difference is the same entry, so at the
    // difference both routes leave the same run.
    match a.iter().zip(b).find(|(x, y)| x != y) {
        Some(((x, _), (y, _))) => matches!(
            (x, y),
            (FollowOn::Success, FollowOn::Failure) | (FollowOn::Failure, FollowOn::Success)
        ),
        None => false,
    }
}

/// Checks a run's `parents` as received (a follow-up run carries at most
/// its parent and the [`MAX_AFTER`] others it waited for).
///
/// # Errors
///
/// [`InvalidFollowUp`] on `parents` when there are more.
pub fn check_parents(parents: &[ParentRun]) -> Result<(), InvalidFollowUp> {
    if parents.len() > MAX_AFTER + 1 {
        return Err(InvalidFollowUp {
            field: "parents".into(),
            reason: format!(
                "{} parents; a follow-up run has at most {}",
                parents.len(),
                MAX_AFTER + 1
            ),
        });
    }
    Ok(())
}

/// The identity part of `run_key` (after `{job_name}@`).
fn identity_of<'a>(job_name: &str, run_key: &'a str) -> Option<&'a str> {
    run_key.strip_prefix(job_name)?.strip_prefix('@')
}

/// A follow-up as written in a schedule file or an API request: the
/// child's options as strings, as a schedule's are.
///
/// ```toml
/// [[schedule.on_success]]
/// name = "load"
/// job_type = "load"
/// payload = { table = "orders" }
/// after = ["extract-b"]   # optional: also wait for extract-b's run of the same instant
/// timeout = "10m"         # optional, as a schedule's
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = FollowUp))]
#[serde(deny_unknown_fields)]
pub struct FollowUpSpec {
    /// The child's job name.
    pub name: String,
    /// The child's job type.
    pub job_type: String,
    /// The child's payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    /// Other jobs whose run of the same instant (or key) must have
    /// succeeded too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    /// Overrides of the child's job type retry policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// The child's per-attempt timeout, e.g. `"10m"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// The child's priority: `high`, `normal` (default) or `low`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// The child's own follow-ups when it succeeds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(no_recursion))]
    pub on_success: Vec<FollowUpSpec>,
    /// The child's own follow-ups when it fails.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(no_recursion))]
    pub on_failure: Vec<FollowUpSpec>,
    /// The child's own follow-ups whatever its end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(no_recursion))]
    pub on_finish: Vec<FollowUpSpec>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(name: &str) -> FollowUp {
        FollowUp {
            job_name: name.into(),
            job_type: "noop".into(),
            ..FollowUp::default()
        }
    }

    #[test]
    fn the_childs_key_is_derived_from_the_parents_identity() {
        let f = FollowUp {
            after: vec!["extract-b".into()],
            ..child("load")
        };
        let key = "extract-a@2026-07-26T02:00:00Z";
        assert_eq!(
            f.child_run_key("extract-a", key).as_deref(),
            Some("load@2026-07-26T02:00:00Z")
        );
        assert_eq!(
            f.other_parent_keys("extract-a", key),
            vec![("extract-b".into(), "extract-b@2026-07-26T02:00:00Z".into())]
        );
        assert_eq!(f.child_run_key("other", key), None);
    }

    #[test]
    fn each_end_enqueues_its_lists() {
        let f = FollowUps {
            on_success: vec![child("s")],
            on_failure: vec![child("f")],
            on_finish: vec![child("a")],
        };
        let names = |status| {
            f.for_status(status)
                .iter()
                .map(|c| c.job_name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names("succeeded"), ["s", "a"]);
        assert_eq!(names("failed"), ["f", "a"]);
        assert_eq!(names("dead"), ["f", "a"]);
        assert_eq!(names("cancelled"), ["a"]);
        assert!(names("running").is_empty());
    }

    #[test]
    fn bad_lists_are_refused_by_field() {
        let cases: Vec<(FollowUps, &str, &str)> = vec![
            (
                FollowUps {
                    on_success: vec![child("nightly")],
                    ..FollowUps::default()
                },
                "on_success[0].job_name",
                "parent's own name",
            ),
            (
                FollowUps {
                    on_success: vec![child("a"), child("a")],
                    ..FollowUps::default()
                },
                "on_success[1].job_name",
                "is also on_success[0]",
            ),
            (
                FollowUps {
                    on_success: vec![child("a")],
                    on_finish: vec![child("a")],
                    ..FollowUps::default()
                },
                "on_finish[0].job_name",
                "is also on_success[0]",
            ),
            (
                // A grandchild named as the root: its key is the root's.
                FollowUps {
                    on_success: vec![FollowUp {
                        options: JobOptions {
                            follow_ups: FollowUps {
                                on_failure: vec![child("nightly")],
                                ..FollowUps::default()
                            },
                            ..JobOptions::default()
                        },
                        ..child("b")
                    }],
                    ..FollowUps::default()
                },
                "on_success[0].options.follow_ups.on_failure[0].job_name",
                "is also the parent",
            ),
            (
                // Cousins under two siblings: both can be enqueued.
                FollowUps {
                    on_success: vec![
                        FollowUp {
                            options: JobOptions {
                                follow_ups: FollowUps {
                                    on_failure: vec![child("x")],
                                    ..FollowUps::default()
                                },
                                ..JobOptions::default()
                            },
                            ..child("b")
                        },
                        FollowUp {
                            options: JobOptions {
                                follow_ups: FollowUps {
                                    on_success: vec![child("x")],
                                    ..FollowUps::default()
                                },
                                ..JobOptions::default()
                            },
                            ..child("c")
                        },
                    ],
                    ..FollowUps::default()
                },
                "on_success[1].options.follow_ups.on_success[0].job_name",
                "is also on_success[0].options.follow_ups.on_failure[0]",
            ),
            (
                FollowUps {
                    on_failure: vec![FollowUp {
                        after: vec!["nightly".into()],
                        ..child("b")
                    }],
                    ..FollowUps::default()
                },
                "on_failure[0].after[0]",
                "the parent itself",
            ),
            (
                FollowUps {
                    on_finish: vec![child("bad name")],
                    ..FollowUps::default()
                },
                "on_finish[0].job_name",
                "job name",
            ),
            (
                FollowUps {
                    on_success: vec![FollowUp {
                        payload: serde_json::json!({"k": "a\u{0}b"}),
                        ..child("c")
                    }],
                    ..FollowUps::default()
                },
                "on_success[0].payload",
                "NUL",
            ),
            (
                FollowUps {
                    on_success: (0..17).map(|i| child(&format!("c{i}"))).collect(),
                    ..FollowUps::default()
                },
                "on_success",
                "at most 16",
            ),
        ];
        for (lists, field, reason) in cases {
            let e = lists.validate("nightly").unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.reason.contains(reason), "{e}");
        }
        // The same name on success and on failure is two different ends,
        // at any depth below them.
        let ok = FollowUps {
            on_success: vec![child("notify")],
            on_failure: vec![FollowUp {
                options: JobOptions {
                    follow_ups: FollowUps {
                        on_finish: vec![child("cleanup")],
                        ..FollowUps::default()
                    },
                    ..JobOptions::default()
                },
                ..child("notify")
            }],
            on_finish: vec![],
        };
        assert_eq!(ok.validate("nightly"), Ok(()));
        let mut wide = FollowUps::default();
        for i in 0..5 {
            let mut f = child(&format!("c{i}"));
            f.options.follow_ups.on_success =
                (0..16).map(|j| child(&format!("c{i}-{j}"))).collect();
            wide.on_success.push(f);
        }
        let e = wide.validate("nightly").unwrap_err();
        assert!(e.reason.contains("at most 64"), "{e}");
    }

    #[test]
    fn nesting_is_bounded() {
        let mut f = child(&format!("c{}", MAX_DEPTH + 1));
        for i in (1..=MAX_DEPTH).rev() {
            let mut parent = child(&format!("c{i}"));
            parent.options.follow_ups.on_success = vec![f];
            f = parent;
        }
        let deep = FollowUps {
            on_success: vec![f.clone()],
            ..FollowUps::default()
        };
        let e = deep.validate("root").unwrap_err();
        assert!(e.reason.contains("nested more than 8"), "{e}");
        let shallow = FollowUps {
            on_success: vec![f.options.follow_ups.on_success[0].clone()],
            ..FollowUps::default()
        };
        assert_eq!(shallow.validate("root"), Ok(()));
    }
}
