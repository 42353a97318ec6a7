//! Rebuilds the ledger when a migration is added, renamed or changed:
//! `sqlx::migrate!` embeds both migration directories at compile time, and
//! cargo does not watch them by itself (a stale build would carry the old
//! migrations).

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
    println!("cargo:rerun-if-changed=sqlite-migrations");
}
