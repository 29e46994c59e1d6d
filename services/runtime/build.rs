//! Build information for `ksched --version` and the `ksched_build_info` metric: the git
//! commit the binary was built from (when built from a git checkout) and the compiler.

use std::process::Command;

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let git_dir = output("git", &["-C", &manifest, "rev-parse", "--git-dir"]);
    if let Some(dir) = &git_dir {
        let dir = std::path::Path::new(&manifest).join(dir);
        println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
        println!("cargo:rerun-if-changed={}", dir.join("refs").display());
    }
    let commit = output("git", &["-C", &manifest, "rev-parse", "--short=12", "HEAD"])
        .unwrap_or_else(|| "unknown".into());
    let dirty = output(
        "git",
        &[
            "-C",
            &manifest,
            "status",
            "--porcelain",
            "--untracked-files=no",
        ],
    )
    .is_some();
    let commit = if dirty && commit != "unknown" {
        format!("{commit}-modified")
    } else {
        commit
    };
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc = output(&rustc, &["--version"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=KSCHED_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=KSCHED_RUSTC_VERSION={rustc}");
    println!("cargo:rerun-if-env-changed=RUSTC");
}
