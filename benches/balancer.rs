//! Balancer picks over 1, 10 and 1,000 endpoints, each pick followed by its release.
//!
//! "Half busy": for round-robin and first-available every other endpoint is at its limit; for
//! random-choice-of-two every other endpoint has 5 requests in flight. Targets: random choice of
//! two and round-robin < 100 ns at 1,000 half-busy endpoints. First-available's worst case (all
//! endpoints but the last full, so every pick reads all n) is measured separately.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use thaw::activator::balancer::{Balancer, Policy};
use thaw::activator::endpoint::{Endpoint, UNLIMITED};

fn endpoints(n: usize, limit: u32) -> Vec<Arc<Endpoint>> {
    (0..n)
        .map(|i| {
            let addr = ([127, 0, (i / 250) as u8, 1], 1000 + (i % 250) as u16).into();
            Arc::new(Endpoint::new(addr, limit))
        })
        .collect()
}

fn fill(e: &Endpoint, n: u32) {
    for _ in 0..n {
        assert!(e.try_reserve());
    }
}

fn pick_release(b: &Balancer, eps: &[Arc<Endpoint>]) {
    let e = b.pick(eps).expect("room");
    black_box(e.addr());
    e.release();
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("balancer_pick_half_busy");
    for n in [1usize, 10, 1000] {
        // Random choice of two (cc 0): unlimited endpoints, every other one loaded.
        let eps = endpoints(n, UNLIMITED);
        for e in eps.iter().step_by(2).skip(usize::from(n == 1)) {
            fill(e, 5);
        }
        let b = Balancer::new(Policy::RandomChoiceOfTwo);
        g.bench_with_input(BenchmarkId::new("random_choice_of_two", n), &n, |bch, _| {
            bch.iter(|| pick_release(&b, &eps))
        });

        // Round-robin (cc 10): every other endpoint full.
        let eps = endpoints(n, 10);
        for e in eps.iter().step_by(2).skip(usize::from(n == 1)) {
            fill(e, 10);
        }
        let b = Balancer::new(Policy::RoundRobin);
        g.bench_with_input(BenchmarkId::new("round_robin", n), &n, |bch, _| {
            bch.iter(|| pick_release(&b, &eps))
        });

        // First-available (cc 2): every other endpoint full.
        let eps = endpoints(n, 2);
        for e in eps.iter().step_by(2).skip(usize::from(n == 1)) {
            fill(e, 2);
        }
        let b = Balancer::new(Policy::FirstAvailable);
        g.bench_with_input(BenchmarkId::new("first_available", n), &n, |bch, _| {
            bch.iter(|| pick_release(&b, &eps))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("balancer_first_available_worst_case");
    for n in [10usize, 1000] {
        let eps = endpoints(n, 2);
        for e in &eps[..n - 1] {
            fill(e, 2);
        }
        let b = Balancer::new(Policy::FirstAvailable);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bch, _| {
            bch.iter(|| pick_release(&b, &eps))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
