//! The HTTP API over mutual TLS with OIDC bearer JWTs (`http.tls`, `http.jwt`,
//! docs/security.md), against `ksched run` and the real broker: certificates made by openssl
//! here, tokens signed here with a key whose JWK the API reads from a file. Plain HTTP, a
//! client without a certificate or with one another CA signed, a CLI that does not trust the
//! API's CA, an expired or foreign token: each refused. A JWT approver is journaled as the
//! token's subject.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const ISSUER: &str = "https://idp.test.invalid";
const AUDIENCE: &str = "ksched-api";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, and `name`.pem / `name`.key signed by it with `usage` (serverAuth, clientAuth).
fn ca(dir: &Path, ca: &str) -> PathBuf {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            &format!("/CN={ca}"),
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.pem"),
        ],
    );
    dir.join(format!("{ca}.pem"))
}

fn leaf(dir: &Path, ca: &str, name: &str, usage: &str) -> (PathBuf, PathBuf) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ],
    );
    std::fs::write(
        dir.join(format!("{name}.ext")),
        format!(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n"
        ),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-out",
            &format!("{name}.pem"),
            "-extfile",
            &format!("{name}.ext"),
        ],
    );
    (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    )
}

/// An ES256 key: the signing half, and the JWKS with its public half.
fn signing_key(kid: &str) -> (jsonwebtoken::EncodingKey, serde_json::Value) {
    use base64::Engine as _;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    (
        jsonwebtoken::EncodingKey::from_ec_der(pkcs8.as_ref()),
        serde_json::json!({ "keys": [{
            "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": kid,
            "x": b64(&point[1..33]), "y": b64(&point[33..65]),
        }]}),
    )
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn jwt(key: &jsonwebtoken::EncodingKey, kid: &str, sub: &str, roles: &[&str], exp: i64) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some(kid.to_owned());
    let claims = serde_json::json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": sub, "exp": exp, "ksched_roles": roles,
    });
    jsonwebtoken::encode(&header, &claims, key).unwrap()
}

#[test]
fn the_api_over_mutual_tls_takes_issuer_jwts_and_refuses_everything_else() {
    let certs = tempfile::tempdir().unwrap();
    let d = certs.path();
    let ca_pem = ca(d, "test-ca");
    let (server_pem, server_key) = leaf(d, "test-ca", "server", "serverAuth");
    let (client_pem, client_key) = leaf(d, "test-ca", "client", "clientAuth");
    ca(d, "rogue-ca");
    let (rogue_pem, rogue_key) = leaf(d, "rogue-ca", "rogue", "clientAuth");
    let (key, jwks) = signing_key("k1");
    let (foreign_key, _) = signing_key("k1");
    let jwks_file = d.join("jwks.json");
    std::fs::write(&jwks_file, jwks.to_string()).unwrap();

    let extra = format!(
        "  tls:\n    cert_file: {}\n    key_file: {}\n    client_ca_file: {}\n\
         \x20 jwt:\n    issuer: {ISSUER}\n    audience: {AUDIENCE}\n    jwks_file: {}\n",
        server_pem.display(),
        server_key.display(),
        ca_pem.display(),
        jwks_file.display()
    );
    let tls = ApiTls {
        ca: ca_pem.clone(),
        client: Some((client_pem, client_key)),
    };
    let c = RunningScheduler::start_tls(&extra, tls.clone());
    let health = format!("{}/health/live", c.api);
    assert_eq!(tls.get(&health), Some(200));

    // Refused at the TLS layer: plain HTTP, no client certificate, one another CA signed.
    let plain = health.replacen("https://", "http://", 1);
    assert!(
        !matches!(http(&plain, "GET", None), Ok((200, _))),
        "plain HTTP answered"
    );
    let without_cert = ApiTls {
        client: None,
        ..tls.clone()
    };
    assert_eq!(without_cert.get(&health), None, "no client certificate");
    let rogue = ApiTls {
        client: Some((rogue_pem, rogue_key)),
        ..tls.clone()
    };
    assert_eq!(rogue.get(&health), None, "a certificate of another CA");

    // A CLI that does not trust the API's CA cannot reach it.
    let out = Command::new(bin())
        .args(["jobs", "list", "--api", &c.api, "--config"])
        .arg(&c.config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot reach"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Over mutual TLS: tokens are needed and checked.
    let in_an_hour = now_s() + 3600;
    let viewer = jwt(&key, "k1", "vera", &["viewer"], in_an_hour);
    let (code, _, err) = c.cli(&["jobs", "list"]);
    assert_eq!(code, 6, "no token: {err}");
    for (what, token) in [
        (
            "expired",
            jwt(&key, "k1", "vera", &["viewer"], now_s() - 600),
        ),
        (
            "signed by another key",
            jwt(&foreign_key, "k1", "vera", &["viewer"], in_an_hour),
        ),
        (
            "without a ksched role",
            jwt(&key, "k1", "vera", &["owner"], in_an_hour),
        ),
    ] {
        let (code, _, err) = c.cli(&["jobs", "list", "--token", &token]);
        assert_eq!(code, 6, "{what}: {err}");
        assert!(err.contains("JWT refused"), "{what}: {err}");
    }
    let (code, _, err) = c.cli(&["jobs", "list", "--token", &viewer]);
    assert_eq!(code, 0, "{err}");

    // alice submits a job that needs approval; carol approves it with her JWT and is
    // journaled as the approver; a viewer may not approve.
    let (code, _, err) = c.cli(&[
        "submit",
        "--topic",
        &c.job_topic,
        "--job-id",
        "tls-1",
        "--tenant",
        "acme",
        "--principal",
        "alice",
        "--label",
        "approval=required",
    ]);
    assert_eq!(code, 0, "{err}");
    wait_until("the job to await approval", 60, || {
        let (_, out, _) = c.cli(&["jobs", "get", "tls-1", "--token", &viewer, "-o", "json"]);
        out.contains("APPROVAL_REQUIRED")
    });
    let (code, _, err) = c.cli(&["approve", "tls-1", "--token", &viewer]);
    assert_eq!(code, 6, "a viewer approved: {err}");
    let carol = jwt(&key, "k1", "carol", &["approver"], in_an_hour);
    let (code, _, err) = c.cli(&["approve", "tls-1", "--token", &carol]);
    assert_eq!(code, 0, "{err}");
    // The API answered once the ApproveJob record was written; the processor journals the
    // approval a moment later (CI once read the journal before it had).
    let mut tail = String::new();
    wait_until("the approval to be journaled", 30, || {
        tail = c
            .cli(&["journal", "tail", "--job", "tls-1", "-o", "json"])
            .1;
        tail.contains("JobApproved")
    });
    let approved: Vec<&str> = tail.lines().filter(|l| l.contains("JobApproved")).collect();
    assert_eq!(approved.len(), 1, "{tail}");
    assert!(approved[0].contains("\"carol\""), "{}", approved[0]);
    c.stop();
}
