//! The module map's rules, computed from the `use` lines (and inline paths) of `src/`:
//!
//! - no circle of imports longer than two files inside `src/activator/` (a pair of files that
//!   import each other is tolerated: a type and its tests, a state and its guard);
//! - the HTTP/1 engine (`src/http1/`) imports nothing of the activator, the autoscaler, the
//!   platform, the revision catalog or telemetry: it knows no revisions;
//! - the autoscaler imports nothing of the activator (the shared stat types live in `stats`);
//! - the queue sidecar (`src/queue/`) imports neither the activator nor the autoscaler: it is
//!   the engine's other handler, over the shared limiter and stat types.
//!
//! A file is a node; an edge `a -> b` is any path in `a` that names `b`'s module (`super::b`,
//! `crate::activator::b`, `self::b` in a `mod.rs`, or a name inside `use super::{b, ...}`).
//! Sibling test files (`#[path = "x_tests.rs"] mod tests;`) count as part of their parent.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("reading src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src/` (`src/activator/lane.rs` -> `activator::lane`,
/// `src/activator/mod.rs` -> `activator`). Test siblings map to their parent module.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    let last = parts.pop().expect("a file name");
    if last != "mod" && last != "lib" && last != "main" {
        let base = last
            .strip_suffix("_tests")
            .map(str::to_string)
            .unwrap_or(last);
        parts.push(base);
    }
    parts
}

/// The code with comments and string literals blanked out, so doc examples and messages do not
/// count as imports.
fn strip_comments_and_strings(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if bytes[i..].starts_with(b"/*") {
            i += 2;
            while i < bytes.len() && !bytes[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                if bytes[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if bytes[i] == b'\''
            && i + 2 < bytes.len()
            && (bytes[i + 2] == b'\'' || bytes[i + 1] == b'\\')
        {
            // a char literal such as 'a' or '\n' (not a lifetime)
            let end = code[i + 1..]
                .find('\'')
                .map(|e| i + 1 + e + 1)
                .unwrap_or(i + 1);
            i = end;
            out.push_str("' '");
        } else {
            out.push(bytes[i] as char);
            i += 1;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Reads one path starting at `s` (after a `::`), returning its segments; a `{...}` group
/// expands to every path inside it.
fn read_tree(s: &str) -> Vec<Vec<String>> {
    let s = s.trim_start();
    if let Some(rest) = s.strip_prefix('{') {
        // split the group at top-level commas
        let mut depth = 0;
        let mut end = rest.len();
        let mut items = Vec::new();
        let mut start = 0;
        for (i, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    end = i;
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&rest[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        items.push(&rest[start..end]);
        return items
            .into_iter()
            .filter(|i| !i.trim().is_empty())
            .flat_map(read_tree)
            .collect();
    }
    let ident: String = s.chars().take_while(|c| is_ident(*c)).collect();
    if ident.is_empty() {
        return vec![vec![]];
    }
    let rest = &s[ident.len()..];
    if let Some(after) = rest.trim_start().strip_prefix("::") {
        read_tree(after)
            .into_iter()
            .map(|mut p| {
                p.insert(0, ident.clone());
                p
            })
            .collect()
    } else {
        vec![vec![ident]]
    }
}

/// Every module path named in `code` (absolute, as `crate::...` segments without `crate`).
fn named_paths(module: &[String], code: &str) -> Vec<Vec<String>> {
    let code = strip_comments_and_strings(code);
    let mut out = Vec::new();
    // the module `super` and `self` refer to from this file
    let here: Vec<String> = module.to_vec();
    // `super` is the parent module both in `x/mod.rs` (module `x`) and in `x/y.rs` (`x::y`).
    let parent: Vec<String> = here[..here.len().saturating_sub(1)].to_vec();
    let self_mod: Vec<String> = here.clone();
    for anchor in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(pos) = code[from..].find(anchor) {
            let at = from + pos;
            from = at + anchor.len();
            if at > 0 && is_ident(code[..at].chars().last().unwrap_or(' ')) {
                continue;
            }
            let base = match anchor {
                "crate::" => Vec::new(),
                "super::" => parent.clone(),
                _ => self_mod.clone(),
            };
            // `super::super::x`
            let mut rest = &code[from..];
            let mut base = base;
            while anchor == "super::" && rest.starts_with("super::") {
                base.pop();
                rest = &rest["super::".len()..];
            }
            for tail in read_tree(rest) {
                let mut p = base.clone();
                p.extend(tail.into_iter().filter(|s| s != "self"));
                out.push(p);
            }
        }
    }
    out
}

struct Graph {
    /// module path (joined by `::`) -> the files' modules it imports
    edges: BTreeMap<String, BTreeSet<String>>,
}

fn build_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| module_of(&src, f).join("::"))
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(&src, file);
        let code = fs::read_to_string(file).expect("reading a source file");
        let from = module.join("::");
        let entry = edges.entry(from.clone()).or_default();
        for path in named_paths(&module, &code) {
            // the longest prefix of `path` that is a file's module
            let target = (1..=path.len())
                .rev()
                .map(|n| path[..n].join("::"))
                .find(|m| modules.contains(m));
            if let Some(t) = target
                && t != from
                && !from.starts_with(&format!("{t}::"))
            {
                entry.insert(t);
            }
        }
    }
    Graph { edges }
}

/// Tarjan's strongly connected components over the modules under `prefix`.
fn circles(g: &Graph, prefix: &str) -> Vec<Vec<String>> {
    let nodes: Vec<&String> = g
        .edges
        .keys()
        .filter(|k| *k == prefix || k.starts_with(&format!("{prefix}::")))
        .collect();
    let index_of: BTreeMap<&String, usize> =
        nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            g.edges[*n]
                .iter()
                .filter_map(|t| index_of.get(t).copied())
                .collect()
        })
        .collect();
    let n = nodes.len();
    let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut counter, mut out) = (Vec::new(), 0, Vec::new());
    fn visit(
        v: usize,
        succ: &[Vec<usize>],
        st: &mut (Vec<usize>, Vec<usize>, Vec<bool>, Vec<usize>, usize),
        out: &mut Vec<Vec<usize>>,
    ) {
        st.0[v] = st.4;
        st.1[v] = st.4;
        st.4 += 1;
        st.3.push(v);
        st.2[v] = true;
        for &w in &succ[v] {
            if st.0[w] == usize::MAX {
                visit(w, succ, st, out);
                st.1[v] = st.1[v].min(st.1[w]);
            } else if st.2[w] {
                st.1[v] = st.1[v].min(st.0[w]);
            }
        }
        if st.1[v] == st.0[v] {
            let mut comp = Vec::new();
            while let Some(w) = st.3.pop() {
                st.2[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            out.push(comp);
        }
    }
    let mut st = (
        std::mem::take(&mut index),
        std::mem::take(&mut low),
        std::mem::take(&mut on),
        std::mem::take(&mut stack),
        std::mem::take(&mut counter),
    );
    let mut comps = Vec::new();
    for v in 0..n {
        if st.0[v] == usize::MAX {
            visit(v, &succ, &mut st, &mut comps);
        }
    }
    for comp in comps {
        if comp.len() > 1 {
            let mut names: Vec<String> = comp.iter().map(|&i| nodes[i].clone()).collect();
            names.sort();
            out.push(names);
        }
    }
    out
}

fn imports_of(g: &Graph, prefix: &str) -> BTreeSet<String> {
    g.edges
        .iter()
        .filter(|(k, _)| *k == prefix || k.starts_with(&format!("{prefix}::")))
        .flat_map(|(_, v)| v.iter().cloned())
        .filter(|t| t != prefix && !t.starts_with(&format!("{prefix}::")))
        .collect()
}

#[test]
fn no_import_circle_in_the_activator_is_longer_than_two_files() {
    let g = build_graph();
    let all = circles(&g, "activator");
    // The pairs that remain (`cargo test --test import_cycles -- --nocapture` lists them).
    eprintln!("import circles in the activator: {all:?}");
    let long: Vec<_> = all.into_iter().filter(|c| c.len() > 2).collect();
    assert!(
        long.is_empty(),
        "import circles longer than two files: {long:#?}"
    );
}

#[test]
fn the_http1_engine_knows_no_revisions() {
    let g = build_graph();
    let forbidden = [
        "activator",
        "autoscaler",
        "platform",
        "revision",
        "telemetry",
        "local",
    ];
    let bad: Vec<String> = imports_of(&g, "http1")
        .into_iter()
        .filter(|m| {
            forbidden
                .iter()
                .any(|f| m == f || m.starts_with(&format!("{f}::")))
        })
        .collect();
    assert!(bad.is_empty(), "the HTTP/1 engine imports {bad:?}");
}

#[test]
fn the_autoscaler_does_not_import_the_activator() {
    let g = build_graph();
    let bad: Vec<String> = imports_of(&g, "autoscaler")
        .into_iter()
        .filter(|m| m == "activator" || m.starts_with("activator::"))
        .collect();
    assert!(bad.is_empty(), "the autoscaler imports {bad:?}");
}

#[test]
fn the_queue_sidecar_imports_no_other_role() {
    let g = build_graph();
    let bad: Vec<String> = imports_of(&g, "queue")
        .into_iter()
        .filter(|m| {
            ["activator", "autoscaler", "local", "platform"]
                .iter()
                .any(|f| m == f || m.starts_with(&format!("{f}::")))
        })
        .collect();
    assert!(bad.is_empty(), "the queue sidecar imports {bad:?}");
}

#[test]
fn the_graph_sees_known_imports() {
    // guards the parser itself: a test that cannot see imports would pass on any code
    let g = build_graph();
    assert!(g.edges["activator::pipeline"].contains("activator::throttler"));
    assert!(g.edges["autoscaler::scaler"].contains("platform"));
    assert!(g.edges["queue::handler"].contains("limiter"));
}
