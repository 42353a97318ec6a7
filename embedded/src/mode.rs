//! Which backends a one-process belfry runs on, from its environment.

use crate::DevError;

/// Where the embedded database goes when `DATABASE_URL` is not set: a
/// directory of the current one, so a clone's `belfry dev` keeps its runs
/// between starts.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://.belfry/dev.db";

/// The backends of a one-process belfry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// SQLite ledger and queue at this `sqlite:` URL.
    Embedded {
        /// The database URL.
        database_url: String,
    },
    /// Postgres, RabbitMQ and (when set) Redis, from the environment.
    Distributed,
}

impl Mode {
    /// The mode `env` asks for: embedded without `DATABASE_URL` or with a
    /// `sqlite:` one; distributed with a Postgres one, which then needs
    /// `AMQP_URL` too.
    ///
    /// # Errors
    ///
    /// [`DevError::Config`] for a `DATABASE_URL` of another kind, or a
    /// Postgres one without `AMQP_URL`.
    pub fn from_env(env: &[(String, String)]) -> Result<Self, DevError> {
        let get = |k: &str| {
            env.iter()
                .rev()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.trim())
                .filter(|v| !v.is_empty())
        };
        match get("DATABASE_URL") {
            None => Ok(Self::Embedded {
                database_url: DEFAULT_DATABASE_URL.into(),
            }),
            Some(url) if url.starts_with("sqlite:") => Ok(Self::Embedded {
                database_url: url.to_owned(),
            }),
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                if get("AMQP_URL").is_none() {
                    return Err(DevError::Config(
                        "DATABASE_URL is a Postgres URL, so belfry dev runs the distributed mode, \
                         which also needs AMQP_URL (RabbitMQ) and, for the claim lock, REDIS_URL; \
                         set them, or unset DATABASE_URL for the embedded mode"
                            .into(),
                    ));
                }
                Ok(Self::Distributed)
            }
            Some(url) => Err(DevError::Config(format!(
                "DATABASE_URL {:?} is neither a sqlite: URL (embedded mode) nor a postgres:// URL \
                 (distributed mode)",
                belfry_runtime::masked(url)
            ))),
        }
    }

    /// One line for people: which mode, and how to switch.
    pub fn describe(&self) -> String {
        match self {
            Self::Embedded { database_url } => format!(
                "embedded mode: ledger and job queue in {database_url} (SQLite), no Postgres, \
                 RabbitMQ or Redis needed; set DATABASE_URL=postgres://..., AMQP_URL and REDIS_URL \
                 for the distributed mode"
            ),
            Self::Distributed => "distributed mode: Postgres (DATABASE_URL), RabbitMQ (AMQP_URL) \
                                  and Redis (REDIS_URL); unset DATABASE_URL for the embedded mode"
                .into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_environment_picks_the_mode() {
        assert_eq!(
            Mode::from_env(&env(&[])).unwrap(),
            Mode::Embedded {
                database_url: DEFAULT_DATABASE_URL.into()
            }
        );
        assert_eq!(
            Mode::from_env(&env(&[("DATABASE_URL", "sqlite:x.db")])).unwrap(),
            Mode::Embedded {
                database_url: "sqlite:x.db".into()
            }
        );
        assert_eq!(
            Mode::from_env(&env(&[
                ("DATABASE_URL", "postgres://u@h/d"),
                ("AMQP_URL", "amqp://h")
            ]))
            .unwrap(),
            Mode::Distributed
        );
        let e = Mode::from_env(&env(&[("DATABASE_URL", "postgres://u:secret@h/d")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("AMQP_URL"), "{e}");
        let e = Mode::from_env(&env(&[("DATABASE_URL", "mysql://u:secret@h/d")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("neither") && !e.contains("secret"), "{e}");
    }
}
