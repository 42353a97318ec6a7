//! What the transaction-pooler route costs (issue 18): a burst of `fires`
//! one-shot fires through one replica whose ledger reaches Postgres
//! directly (the baseline, cached prepared statements) or through the
//! PgBouncer of `scripts/pgbouncer` in transaction mode (every statement
//! unnamed, in a transaction of its own), the two alternating, `rounds`
//! times. Fires/s is the burst's fires over the time from their instant to
//! the last one dispatched.

use crate::dispatch_burst::{belfry_burst, LedgerRoute};
use crate::sample::median;

/// Runs the comparison and prints the table.
///
/// # Errors
///
/// When the pooler does not answer (start it with `scripts/pgbouncer up`)
/// or a service fails.
pub async fn run(fires: usize, rounds: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        tokio::net::TcpStream::connect("127.0.0.1:56432")
            .await
            .is_ok(),
        "no PgBouncer on 127.0.0.1:56432: start it with scripts/pgbouncer up"
    );
    let (mut direct, mut pooled) = (Vec::new(), Vec::new());
    for round in 1..=rounds.max(1) {
        let d = belfry_burst(1, fires, LedgerRoute::Direct, None).await?;
        let p = belfry_burst(1, fires, LedgerRoute::Pooler, None).await?;
        anyhow::ensure!(
            d.lost == 0 && p.lost == 0 && d.duplicates == 0 && p.duplicates == 0,
            "round {round}: fires lost or doubled (direct {}/{}, pooler {}/{})",
            d.lost,
            d.duplicates,
            p.lost,
            p.duplicates
        );
        println!(
            "round {round}: fires/s direct {:.0} through the pooler {:.0} ({:.2}); p99 ms {:.0} / {:.0}",
            d.rate,
            p.rate,
            p.rate / d.rate,
            d.p99_ms,
            p.p99_ms
        );
        direct.push(d.rate);
        pooled.push(p.rate);
    }
    let ratios: Vec<f64> = direct.iter().zip(&pooled).map(|(d, p)| p / d).collect();
    println!("| measure | direct (baseline) | through PgBouncer | pooler / direct |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| fires/s, burst of {fires}, 1 replica (median of {}) | {:.0} | {:.0} | {:.2} |",
        direct.len(),
        median(direct),
        median(pooled),
        median(ratios)
    );
    Ok(())
}
