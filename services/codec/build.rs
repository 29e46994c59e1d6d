//! Embeds every schema under `schemas/` (current definitions and `history/` snapshots) so the
//! codec needs no files at run time.

use std::{env, fs, path::Path};

fn main() {
    let manifest = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest).join("../../schemas");
    let mut out = String::new();
    for (dir, list) in [(root.clone(), "CURRENT"), (root.join("history"), "HISTORY")] {
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut files: Vec<_> = fs::read_dir(&dir)
            .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        files.retain(|p| p.extension().is_some_and(|e| e == "avsc"));
        files.sort();
        out.push_str(&format!("pub(crate) static {list}: &[(&str, &str)] = &[\n"));
        for p in files {
            println!("cargo:rerun-if-changed={}", p.display());
            let name = p
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("utf-8 file name");
            let abs = fs::canonicalize(&p).expect("schema path");
            out.push_str(&format!(
                "    ({name:?}, include_str!({:?})),\n",
                abs.display()
            ));
        }
        out.push_str("];\n");
    }
    let dest = Path::new(&env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("schemas.rs");
    fs::write(dest, out).expect("write schemas.rs");
}
