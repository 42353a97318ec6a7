//! The `belfry-scheduler` process: a scheduler replica (the engine in
//! `belfry_scheduler`, which knows nothing of HTTP) served with its REST
//! API, web view and `/metrics`.
//!
//! - [`config`]: the engine's settings plus the API's;
//! - [`service`]: connect (waiting out services that restart), serve, follow
//!   schedule changes, prune old runs, and run the replica until cancelled;
//! - [`api`]: the REST API, thin handlers over the engine's operator
//!   actions (`belfry_scheduler::ops`), with its tokens and roles;
//! - [`ui`]: the web view, which calls the same operator actions.

pub mod api;
pub mod config;
pub mod error;
pub mod service;
pub mod ui;

pub use config::ServerConfig;
pub use error::ServerError;
pub use service::Service;
