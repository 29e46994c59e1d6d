//! Every tool takes Kafka client properties the same way (the settings file's
//! `kafka.properties`, `KSCHED__*` variables, `--command-config FILE`, `-X key=value`), fails
//! loudly on a settings file it cannot use, and never prints a secret. No broker needed: a
//! property librdkafka refuses shows that it reached the client.

use std::path::{Path, PathBuf};
use std::process::Command;

fn ksched(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ksched"));
    cmd.args(args).env_remove("KSCHED_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn repo_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/ksched.yaml")
}

#[test]
fn a_settings_file_that_is_missing_or_broken_is_an_error_not_a_default() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.yaml");
    let (code, _, err) = ksched(
        &["jobs", "list", "--config", missing.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not found"), "{err}");

    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "kafka:\n  bootstrap_servers: [unclosed\n").unwrap();
    let (code, _, err) = ksched(
        &["workers", "list", "--config", broken.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("broken.yaml"), "{err}");

    let (code, _, err) = ksched(&["journal", "tail", "-X", "novalue"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("key=value"), "{err}");
}

#[test]
fn properties_from_flags_files_and_the_environment_reach_the_cli_clients() {
    let dir = tempfile::tempdir().unwrap();
    // -X: librdkafka refuses the value, so the client saw it.
    let (code, _, err) = ksched(
        &[
            "journal",
            "tail",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "-X",
            "security.protocol=bogus",
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("security.protocol"), "{err}");

    // --command-config.
    let file = dir.path().join("client.properties");
    std::fs::write(
        &file,
        "# as kafka-console-consumer takes it\nsasl.mechanism=NOPE\n",
    )
    .unwrap();
    let (code, _, err) = ksched(
        &[
            "audit",
            "verify",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--command-config",
            file.to_str().unwrap(),
            "-X",
            "security.protocol=SASL_PLAINTEXT",
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("NOPE"), "{err}");

    // KSCHED__* variables layer over the settings file for the CLI as for `run`.
    let (code, _, err) = ksched(
        &[
            "submit",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--topic",
            "t",
            "--tenant",
            "a",
        ],
        &[("KSCHED__KAFKA__PROPERTIES__SECURITY.PROTOCOL", "bogus")],
    );
    assert_ne!(code, 0);
    assert!(err.contains("security.protocol"), "{err}");
}

#[test]
fn print_config_masks_secret_properties() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("client.properties");
    std::fs::write(
        &file,
        "security.protocol=SASL_SSL\nsasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"k\" password=\"jaas-secret\";\n",
    )
    .unwrap();
    let (code, out, err) = ksched(
        &[
            "run",
            "--config",
            repo_config().to_str().unwrap(),
            "--print-config",
            "--command-config",
            file.to_str().unwrap(),
            "-X",
            "sasl.password=hunter2",
            "-X",
            "sasl.username=ksched",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.contains("hunter2") && !out.contains("jaas-secret"),
        "{out}"
    );
    assert!(
        out.contains("SASL_SSL") && out.contains("sasl.username: ksched"),
        "{out}"
    );
    assert!(
        out.contains("sasl.password: '*hidden*'") || out.contains("sasl.password: \"*hidden*\""),
        "{out}"
    );
}
