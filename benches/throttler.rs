//! Throttler hot path: an uncontended admit + release (`try_acquire` then dropping the
//! `InFlight` guard), the cost every warm request pays. Target: < 100 ns.
//!
//! `throttler_two_workers`: the same on both data workers of a two-worker pool at once (one
//! throttler, as when both serve one revision), timed per admit + release on each worker. What
//! it adds over the uncontended figure is the cost of cache lines both cores write.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use prometheus_client::metrics::gauge::Gauge;
use thaw::activator::throttler::{HeldBudget, Throttler};
use thaw::percore::Workers;
use thaw::platform::EndpointSnapshot;
use tokio::time::Instant;

fn throttler(endpoints: u16, cc: u32) -> Throttler {
    let t = Throttler::new(
        Arc::new(HeldBudget::default()),
        &Arc::from("bench"),
        Gauge::default(),
        Box::new(|_| {}),
    );
    let ready = (0..endpoints)
        .map(|p| ([127, 0, 0, 1], 1000 + p).into())
        .collect();
    t.update(
        &EndpointSnapshot {
            limit: None,
            ready,
            ..Default::default()
        },
        cc,
        0,
    );
    t
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("throttler_acquire_release");
    for (name, endpoints, cc) in [
        ("cc0_p2c_1ep", 1, 0),
        ("cc0_p2c_10ep", 10, 0),
        ("cc1_first_available_10ep", 10, 1),
        ("cc10_round_robin_10ep", 10, 10),
    ] {
        let t = throttler(endpoints, cc);
        g.bench_function(name, |b| {
            b.iter(|| {
                let slot = t.try_acquire().expect("capacity");
                black_box(slot.addr());
                drop(slot);
            })
        });
    }
    g.finish();

    let workers = Workers::start(2).expect("workers");
    let mut g = c.benchmark_group("throttler_two_workers");
    for (name, endpoints, cc) in [("cc0_p2c_1ep", 1, 0), ("cc0_p2c_10ep", 10, 0)] {
        let t = Arc::new(throttler(endpoints, cc));
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                // Both workers run `iters` admits + releases at once; the slower one's time
                // is the figure (per admit + release on one worker).
                let (tx, rx) = std::sync::mpsc::channel();
                let start = Arc::new(std::sync::Barrier::new(2));
                for _ in 0..2 {
                    let (t, tx, start) = (t.clone(), tx.clone(), start.clone());
                    workers.next().spawn(async move {
                        start.wait();
                        let begun = Instant::now();
                        for _ in 0..iters {
                            let slot = t.try_acquire().expect("capacity");
                            black_box(slot.addr());
                            drop(slot);
                        }
                        tx.send(begun.elapsed()).unwrap();
                    });
                }
                drop(tx);
                rx.iter().max().unwrap_or(Duration::ZERO)
            })
        });
    }
    g.finish();
    workers.stop();
}

criterion_group!(benches, bench);
criterion_main!(benches);
