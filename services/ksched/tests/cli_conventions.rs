//! What a command-line tool is expected to do: say what it is (`--version` with the commit
//! and compiler it was built with) and complete its own commands in a shell.

mod common;

use std::process::Command;

use common::ksched;

#[test]
fn version_names_the_build() {
    let (code, out, err) = ksched(&["--version"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("ksched {}\n", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} in {out}"))
            .to_owned()
    };
    let commit = field("commit");
    assert!(
        commit == "unknown" || commit.chars().take(12).all(|c| c.is_ascii_hexdigit()),
        "{commit}"
    );
    assert!(field("compiler").starts_with("rustc "), "{out}");
    field("features");
    // -V stays one line, for scripts.
    let (_, short, _) = ksched(&["-V"]);
    assert_eq!(
        short.trim(),
        format!("ksched {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn completion_scripts_load_in_their_shells() {
    let (code, script, err) = ksched(&["completions", "bash"]);
    assert_eq!(code, 0, "{err}");
    // Through a file, as users load it: the script is larger than one argument may be.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &script).unwrap();
    let bash = Command::new("bash")
        .arg("-c")
        .arg("source \"$1\" && complete -p ksched")
        .arg("bash")
        .arg(file.path())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&bash.stdout).contains("-F _ksched ksched"),
        "{}",
        String::from_utf8_lossy(&bash.stderr)
    );
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let (code, script, _) = ksched(&["completions", shell]);
        assert_eq!(code, 0);
        assert!(
            script.contains("audit") && script.contains("journal"),
            "{shell}"
        );
    }
    let (code, _, err) = ksched(&["completions", "tcsh"]);
    assert_eq!(code, 2, "{err}");
}
