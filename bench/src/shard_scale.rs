//! Scale-out with sharding (issue 21): a burst of one-shot fires due at one
//! second, dispatched by 1 and 3 replicas with sharding off (every replica
//! races every fire) and on (each fire is its shard owner's), beside the
//! batched raw pipeline measured in the same run (one Redis pipeline, one
//! multi-row insert, confirms together, one update per 256 fires, no
//! belfry code: the machine's real limit). Rates are medians over rounds;
//! CPU per fire is this process's (all replicas'), so the per-replica
//! share is it divided by the replicas.

use belfry_scheduler::ShardSettings;

use crate::dispatch_burst::{belfry_burst, raw_batched, LedgerRoute};

/// One measured case.
struct Case {
    burst: usize,
    replicas: usize,
    sharded: bool,
    rates: Vec<f64>,
    p99: Vec<f64>,
    cpu_ms: Vec<f64>,
    duplicates: i64,
    lost: i64,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs each burst size `rounds` times (cases alternating) and prints the
/// table.
pub async fn run(bursts: &[usize], rounds: usize) -> anyhow::Result<()> {
    let mut raw: Vec<(usize, Vec<f64>)> = bursts.iter().map(|&b| (b, Vec::new())).collect();
    let mut cases: Vec<Case> = bursts
        .iter()
        .flat_map(|&burst| {
            [(1, false), (3, false), (1, true), (3, true)].map(|(replicas, sharded)| Case {
                burst,
                replicas,
                sharded,
                rates: Vec::new(),
                p99: Vec::new(),
                cpu_ms: Vec::new(),
                duplicates: 0,
                lost: 0,
            })
        })
        .collect();
    for round in 1..=rounds.max(1) {
        for (burst, rates) in &mut raw {
            let rate = raw_batched(*burst, 4).await?;
            println!("round {round}: raw batched, {burst} fires: {rate:.0}/s");
            rates.push(rate);
        }
        for case in &mut cases {
            let sharding = case.sharded.then(ShardSettings::default);
            let m = belfry_burst(case.replicas, case.burst, LedgerRoute::Direct, sharding).await?;
            println!(
                "round {round}: {} fires, {} replica(s), sharding {}: {:.0}/s, p99 {:.0} ms, {:.3} ms CPU per fire, dup {}, lost {}",
                case.burst,
                case.replicas,
                if case.sharded { "on" } else { "off" },
                m.rate,
                m.p99_ms,
                m.cpu_ms,
                m.duplicates,
                m.lost
            );
            case.rates.push(m.rate);
            case.p99.push(m.p99_ms);
            case.cpu_ms.push(m.cpu_ms);
            case.duplicates += m.duplicates;
            case.lost += m.lost;
        }
    }
    println!();
    println!("burst dispatch, median of {rounds} round(s)");
    println!();
    println!("| fires | replicas | sharding | fires/s | vs raw batched (same run) | vs 1 replica, same sharding | p99 lateness ms | CPU ms per fire (all) | CPU ms per fire per replica | dup | lost |");
    println!("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (burst, raw_rates) in &raw {
        let raw_rate = median(raw_rates);
        println!("| {burst} | raw batched | – | {raw_rate:.0} | 1.00 × | | | | | | |");
        for sharded in [false, true] {
            let one = cases
                .iter()
                .find(|c| c.burst == *burst && c.sharded == sharded && c.replicas == 1)
                .map(|c| median(&c.rates))
                .unwrap_or(f64::NAN);
            for case in cases
                .iter()
                .filter(|c| c.burst == *burst && c.sharded == sharded)
            {
                let rate = median(&case.rates);
                let cpu = median(&case.cpu_ms);
                println!(
                    "| {burst} | {} | {} | {rate:.0} | {:.2} × | {:.2} × | {:.0} | {cpu:.3} | {:.3} | {} | {} |",
                    case.replicas,
                    if sharded { "on" } else { "off" },
                    rate / raw_rate,
                    rate / one,
                    median(&case.p99),
                    cpu / case.replicas as f64,
                    case.duplicates,
                    case.lost
                );
            }
        }
    }
    Ok(())
}
