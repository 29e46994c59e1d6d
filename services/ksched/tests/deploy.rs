//! The deployment files we ship but cannot run here (no Docker engine, no cluster) are at
//! least well-formed and agree with the code: images, commands, ports and probe paths.

use serde_norway::Value;

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn docs(path: &str) -> Vec<Value> {
    let text = read(path);
    serde_norway::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{path}: {e}")))
        .collect()
}

#[test]
fn compose_files_parse_and_wire_kafka_ksched_and_workers() {
    let base = &docs("deploy/docker-compose.yml")[0];
    assert!(
        base["services"]["kafka"]["image"]
            .as_str()
            .unwrap()
            .starts_with("apache/kafka:4")
    );
    let full = &docs("deploy/docker-compose.ksched.yml")[0];
    let services = full["services"].as_mapping().unwrap();
    for s in ["kafka", "ksched", "worker-1", "worker-2"] {
        assert!(services.contains_key(s), "service {s}");
    }
    let env = &full["services"]["ksched"]["environment"];
    assert_eq!(
        env["KSCHED__KAFKA__BOOTSTRAP_SERVERS"].as_str(),
        Some("kafka:9092")
    );
    assert_eq!(env["KSCHED__HTTP__LISTEN"].as_str(), Some("0.0.0.0:8080"));
    // Beyond loopback the API needs tokens: the compose file mounts a tokens file whose demo
    // token is the one its healthcheck sends.
    assert_eq!(
        env["KSCHED__HTTP__TOKENS_FILE"].as_str(),
        Some("/etc/ksched/api-tokens.yaml")
    );
    let tokens = read("deploy/compose-api-tokens.yaml");
    let demo = env["KSCHED_API_TOKEN"].as_str().unwrap();
    assert!(tokens.contains(&ksched_core::hash::sha256_hex(demo.as_bytes())));
    ksched_api::auth::Auth::parse(&tokens).unwrap();
    let entry = full["services"]["worker-1"]["entrypoint"]
        .as_sequence()
        .unwrap();
    assert_eq!(entry[0].as_str(), Some("echo_worker"));
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.contains("--example echo_worker") && dockerfile.contains("COPY config/"));
}

#[test]
fn kubernetes_manifests_parse_and_probe_the_health_routes() {
    let all: Vec<Value> = [
        "deploy/k8s/configmap.yaml",
        "deploy/k8s/api-access.yaml",
        "deploy/k8s/statefulset.yaml",
        "deploy/k8s/workers.yaml",
    ]
    .iter()
    .flat_map(|p| docs(p))
    .collect();
    let kinds: Vec<&str> = all.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "ConfigMap",
            "Secret",
            "NetworkPolicy",
            "StatefulSet",
            "Service",
            "Deployment"
        ]
    );
    let sts = all
        .iter()
        .find(|d| d["kind"].as_str() == Some("StatefulSet"))
        .unwrap();
    assert_eq!(
        sts["spec"]["replicas"].as_i64(),
        Some(2),
        "an owner and a standby (processor.lease)"
    );
    let c = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        c["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/health/live")
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/health/ready")
    );
    assert!(sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"].as_str() == Some("data"));
    // The config map's settings are valid ksched settings.
    let cm = &all[0];
    let settings = ksched_runtime_settings(cm["data"]["ksched.yaml"].as_str().unwrap());
    assert!(settings.contains("0.0.0.0:8080"));
    // ... which needs API tokens: the secret's file parses and the pod mounts it there.
    assert!(
        settings.contains("tokens_file: /etc/ksched/tokens/tokens.yaml"),
        "{settings}"
    );
    let secret = all
        .iter()
        .find(|d| d["kind"].as_str() == Some("Secret"))
        .unwrap();
    ksched_api::auth::Auth::parse(secret["stringData"]["tokens.yaml"].as_str().unwrap()).unwrap();
    let mounts = c["volumeMounts"].as_sequence().unwrap();
    assert!(
        mounts
            .iter()
            .any(|m| m["mountPath"].as_str() == Some("/etc/ksched/tokens"))
    );
    let np = all
        .iter()
        .find(|d| d["kind"].as_str() == Some("NetworkPolicy"))
        .unwrap();
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"].as_str(),
        Some("ksched")
    );
}

/// Parses settings through the same code `ksched run` uses, via `--print-config`.
fn ksched_runtime_settings(yaml: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ksched.yaml"), yaml).unwrap();
    std::fs::write(dir.path().join("pools.yaml"), "topics: {}\npools: {}\n").unwrap();
    std::fs::create_dir(dir.path().join("policy")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ksched"))
        .args(["run", "--print-config", "--config"])
        .arg(dir.path().join("ksched.yaml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
