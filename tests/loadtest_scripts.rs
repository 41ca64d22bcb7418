//! The load-test scripts say one thing: cold.sh's phase rows come from the revision's own
//! series (they printed 0.000 ms once the series gained labels), warm.sh's summary ends in one
//! verdict that cannot contradict itself, and lib.sh's noise check sees CPU used by other
//! processes, not only the hypervisor's steal. cold.sh runs briefly against this build's thaw
//! (`THAW=`), on loopback; its figures are not judged here, only its output's shape.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

const REPO: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn cold_sh_reports_each_cold_starts_phases_from_its_own_series() {
    let out_dir = tempfile::tempdir().unwrap();
    let run = Command::new("bash")
        .arg(Path::new(REPO).join("loadtests/cold.sh"))
        .env("THAW", env!("CARGO_BIN_EXE_thaw"))
        .env("LT_OUT", out_dir.path())
        .env("N", "2")
        .output()
        .expect("run bash");
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "cold.sh failed:\n{log}");
    assert!(log.contains("thaw binary: "), "{log}");
    assert!(
        !log.contains("building thaw"),
        "THAW= must skip the build:\n{log}"
    );
    let dir = out_dir.path().join("cold");
    let tsv = std::fs::read_to_string(dir.join("results.tsv")).unwrap();
    let mut lines = tsv.lines();
    let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), 2, "{tsv}");
    for phase in ["poke_to_decision_ms", "ready_to_first_byte_ms"] {
        for r in &rows {
            assert_eq!(r.len(), header.len(), "{tsv}");
            assert_eq!(r[col("status")], "200", "{tsv}");
            // Each cold start has its phases recorded: a real duration, never the 0.000 of a
            // series the script failed to find.
            let ms: f64 = r[col(phase)].parse().unwrap();
            assert!(ms > 0.0, "{phase} not found in /metrics:\n{tsv}\n{log}");
        }
    }
    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(summary.contains("2/2 answered 200"), "{summary}");
    assert!(
        summary.contains("| of which: poke to scale decision |"),
        "{summary}"
    );
}

/// One pair of runs: tool, connections, round, thaw's and nginx's (req/s, p99 ms), and the
/// percent of the CPU others used.
type Pair = (&'static str, u32, u32, (f64, f64), (f64, f64), f64);

/// warm.sh's summary on `rows`: its output.
fn warm_summary(rows: &[Pair]) -> String {
    let mut child = Command::new("python3")
        .arg(Path::new(REPO).join("loadtests/warm_summary.py"))
        .env("MAX_OTHERS", "3")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    let mut input = String::new();
    for (tool, c, round, thaw, nginx, others) in rows {
        for (proxy, (rps, p99)) in [("thaw", thaw), ("nginx", nginx)] {
            input.push_str(&format!(
                "{tool} c{c} {proxy} {rps} 0.300 {p99} 0 20.0 {round} {others}\n"
            ));
        }
    }
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The one verdict line of a summary (exactly one).
fn verdict(summary: &str) -> String {
    let v: Vec<&str> = summary
        .lines()
        .filter(|l| l.contains("Verdict") || l.contains("NOT met") || l.contains("not judged"))
        .filter(|l| !l.starts_with('|'))
        .collect();
    assert_eq!(v.len(), 1, "one verdict line:\n{summary}");
    v[0].to_string()
}

#[test]
fn warm_summary_ends_in_one_verdict_that_cannot_contradict_itself() {
    // Three rounds of a clear loss: too few pairs to judge, and it says only that.
    let loss: Vec<_> = (1..=3)
        .map(|r| ("wrk", 32, r, (9000.0, 1.3), (10000.0, 1.0), 0.2))
        .collect();
    let s = warm_summary(&loss);
    assert!(
        verdict(&s).starts_with("Verdict: not judged: fewer than 5 clean pairs in wrk c32"),
        "{s}"
    );
    assert!(!s.contains("NOT met") && !s.contains("Shown behind"), "{s}");

    // Nine rounds of the same loss: behind.
    let loss: Vec<_> = (1..=9)
        .map(|r| {
            (
                "wrk",
                32,
                r,
                (9000.0 + f64::from(r), 1.3),
                (10000.0, 1.0),
                0.2,
            )
        })
        .collect();
    let s = warm_summary(&loss);
    assert_eq!(
        verdict(&s),
        "Verdict: NOT met: thaw is behind nginx in wrk c32",
        "{s}"
    );

    // Nine rounds alternating either side of 1, the median just under: not shown either way.
    let tie: Vec<_> = (1..=9)
        .map(|r| {
            let t = if r % 2 == 0 { 10100.0 } else { 9900.0 };
            ("wrk", 32, r, (t, 1.0), (10000.0, 1.0), 0.2)
        })
        .collect();
    let s = warm_summary(&tie);
    assert!(
        verdict(&s).starts_with("Verdict: not shown either way: a median misses in wrk c32"),
        "{s}"
    );

    // Nine clean wins: met.
    let win: Vec<_> = (1..=9)
        .map(|r| {
            (
                "wrk",
                64,
                r,
                (11000.0 + f64::from(r), 0.9),
                (10000.0, 1.0),
                0.2,
            )
        })
        .collect();
    let s = warm_summary(&win);
    assert!(verdict(&s).starts_with("Verdict: met in every row"), "{s}");

    // The same wins measured while others used the CPU: left out, so not judged.
    let noisy: Vec<_> = win
        .iter()
        .map(|&(a, b, c, d, e, _)| (a, b, c, d, e, 12.0))
        .collect();
    let s = warm_summary(&noisy);
    assert!(verdict(&s).starts_with("Verdict: not judged"), "{s}");
    assert!(s.contains("| 9 of 9 |"), "{s}");
}

/// lib.sh's noise check counts a process that is not the benchmark's (here a busy loop the
/// check is not told about) as CPU used by others.
#[test]
fn the_noise_check_sees_other_processes() {
    let script = format!(
        ". {REPO}/loadtests/lib.sh\n\
         OWN_PIDS=\"\"\n\
         snap=$(cpu_ticks)\n\
         sh -c 'while :; do :; done' &\n\
         busy=$!\n\
         trap 'kill \"$busy\"' EXIT\n\
         sleep 1\n\
         others_pct_since \"$snap\"\n"
    );
    let out = Command::new("bash")
        .args(["-c", &script])
        .output()
        .expect("run bash");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pct: f64 = text.trim().parse().unwrap_or_else(|_| panic!("{text:?}"));
    // A busy loop for a second on this machine's cores: a share well above nothing, whatever
    // else runs (other load only adds to it).
    assert!(pct > 1.0, "others: {pct}%");
}
