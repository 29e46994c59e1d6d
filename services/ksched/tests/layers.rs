//! The crates' layering (docs/architecture.md, "Crates"): each crate depends only on the
//! crates below it, the processor knows no web server, the fault suite is not in the product,
//! and no module of the runtime or the API imports, through others, one that imports it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn services() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The names under `[dependencies]` of a crate's Cargo.toml.
fn dependencies(krate: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(services().join(krate).join("Cargo.toml")).unwrap();
    let mut section = "";
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line;
        } else if section == "[dependencies]"
            && !line.starts_with('#')
            && let Some((name, _)) = line.split_once(['=', '.'])
        {
            out.insert(name.trim().to_owned());
        }
    }
    out
}

/// What each crate may depend on among ksched's own: the layers, bottom up.
#[test]
fn every_crate_depends_only_on_the_crates_below_it() {
    let allowed: BTreeMap<&str, &[&str]> = BTreeMap::from([
        ("core", &[][..]),
        ("codec", &["ksched-core"][..]),
        ("policy", &["ksched-core"][..]),
        ("store", &["ksched-core"][..]),
        ("secrets", &["ksched-core"][..]),
        (
            "worker",
            &["ksched-core", "ksched-codec", "ksched-secrets"][..],
        ),
        (
            "runtime",
            &[
                "ksched-core",
                "ksched-codec",
                "ksched-policy",
                "ksched-store",
                "ksched-secrets",
            ][..],
        ),
        (
            "api",
            &[
                "ksched-core",
                "ksched-codec",
                "ksched-policy",
                "ksched-store",
                "ksched-runtime",
            ][..],
        ),
        (
            "ksched",
            &[
                "ksched-core",
                "ksched-codec",
                "ksched-policy",
                "ksched-store",
                "ksched-secrets",
                "ksched-runtime",
                "ksched-api",
                "ksched-worker",
            ][..],
        ),
        (
            "chaos",
            &[
                "ksched-core",
                "ksched-codec",
                "ksched-runtime",
                "ksched-worker",
            ][..],
        ),
        ("testkit", &[][..]),
    ]);
    for (krate, may) in &allowed {
        for dep in dependencies(krate) {
            if dep.starts_with("ksched") {
                assert!(
                    may.contains(&dep.as_str()),
                    "services/{krate} depends on {dep}, which is not below it"
                );
            }
        }
    }
    // The processor does not know that a web server exists.
    for web in [
        "axum",
        "hyper",
        "hyper-util",
        "rustls",
        "tokio-rustls",
        "jsonwebtoken",
    ] {
        assert!(
            !dependencies("runtime").contains(web),
            "the runtime depends on {web}"
        );
    }
}

/// The top-level modules of a crate's `src` and the ones each names through `crate::`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut all = Vec::new();
    files(src, &mut all);
    let module_of = |p: &Path| {
        let rel = p.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        first.trim_end_matches(".rs").to_owned()
    };
    let modules: BTreeSet<String> = all.iter().map(|p| module_of(p)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in &all {
        let from = module_of(p);
        let text = std::fs::read_to_string(p).unwrap();
        // Tests may reach anywhere.
        let text = text.split("#[cfg(test)]").next().unwrap();
        for (i, _) in text.match_indices("crate::") {
            let name: String = text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name != from && modules.contains(&name) && from != "lib" {
                graph.entry(from.clone()).or_default().insert(name);
            }
        }
    }
    graph
}

/// A cycle in `graph`, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            return Some(path[at..].to_vec());
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_imports_itself_through_others() {
    for krate in ["runtime", "api"] {
        let graph = module_graph(&services().join(krate).join("src"));
        assert!(graph.len() > 3, "{krate}: {graph:?}");
        if let Some(c) = cycle(&graph) {
            panic!("services/{krate}: import cycle {}", c.join(" -> "));
        }
    }
}

/// The cycle finder finds one (the test above could not fail otherwise).
#[test]
fn a_cycle_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::from([
        ("a".into(), BTreeSet::from(["b".into()])),
        ("b".into(), BTreeSet::from(["c".into()])),
        ("c".into(), BTreeSet::from(["a".into()])),
    ]);
    assert_eq!(
        cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into()])
    );
    let acyclic: BTreeMap<String, BTreeSet<String>> =
        BTreeMap::from([("a".into(), BTreeSet::from(["b".into()]))]);
    assert_eq!(cycle(&acyclic), None);
}

/// The fault suite's binary is not the product's: `ksched` has no `chaos` command.
#[test]
fn the_product_binary_does_not_hold_the_fault_suite() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ksched"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("bench"), "{help}");
    assert!(!help.contains("chaos"), "{help}");
    assert!(!services().join("ksched/src/chaos").exists());
}
