//! Throttler hot path: an uncontended admit + release (`try_acquire` then dropping the
//! `InFlight` guard), the cost every warm request pays. Target: < 100 ns.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use prometheus_client::metrics::gauge::Gauge;
use thaw::activator::throttler::{HeldBudget, Throttler};
use thaw::platform::EndpointSnapshot;

fn throttler(endpoints: u16, cc: u32) -> Throttler {
    let t = Throttler::new(
        Arc::new(HeldBudget::default()),
        Gauge::default(),
        Box::new(|_| {}),
    );
    let ready = (0..endpoints)
        .map(|p| ([127, 0, 0, 1], 1000 + p).into())
        .collect();
    t.update(
        &EndpointSnapshot {
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
}

criterion_group!(benches, bench);
criterion_main!(benches);
