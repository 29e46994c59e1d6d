//! Who calls the HTTP API and what they may do (docs/security.md). Identities come from API
//! tokens: `http.tokens_file` lists each principal with the SHA-256 of its token, its roles
//! and, for tenant-scoped principals, its tenants; or from bearer JWTs an OIDC issuer signed
//! (`http.jwt`), whose claims carry the principal, roles and tenants. The principal an approval, rejection or
//! cancellation is journaled with is the caller's, never a name from the request body.
//!
//! Without either the API has no authentication (`ksched run` then listens on
//! loopback only) and every caller is [`Identity::local`].

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use ksched_core::hash::sha256_hex;
use ksched_runtime::error::{Error, Result};
use serde::Deserialize;

/// What a principal may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads jobs (of its tenants, when it has any), workers.
    Viewer,
    /// A viewer that may cancel jobs.
    Operator,
    /// A viewer that may approve and reject jobs.
    Approver,
    /// Reads everything: jobs of every tenant, the DLQ, tenants.
    Auditor,
    /// Everything, including checkpoints.
    Admin,
}

/// An action on the API, as the routes need them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Read,
    Cancel,
    /// Submit a dead-lettered job again (an operator's, like cancel).
    Redrive,
    /// Create, change, pause, resume, trigger or delete a schedule (an operator's).
    Schedule,
    Decide,
    Checkpoint,
    /// Time travel and what-if: replays of a shard's whole journal (an auditor's or an
    /// operator's, not a viewer's: each one costs a core for minutes).
    Replay,
}

/// The caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// None for the unauthenticated local caller, whose requests name their principal.
    pub principal: Option<String>,
    pub roles: BTreeSet<Role>,
    /// The tenants whose jobs it may see and act on; None: every tenant.
    pub tenants: Option<BTreeSet<String>>,
}

impl Identity {
    /// The caller when the API has no authentication (loopback only): everything.
    pub fn local() -> Identity {
        Identity {
            principal: None,
            roles: [Role::Admin].into(),
            tenants: None,
        }
    }

    pub fn may(&self, action: Action) -> bool {
        let has = |r: Role| self.roles.contains(&r) || self.roles.contains(&Role::Admin);
        match action {
            Action::Read => !self.roles.is_empty(),
            Action::Cancel | Action::Redrive | Action::Schedule => has(Role::Operator),
            Action::Decide => has(Role::Approver),
            Action::Checkpoint => has(Role::Admin),
            Action::Replay => has(Role::Auditor) || has(Role::Operator),
        }
    }

    /// Whether it may see jobs of `tenant`.
    pub fn sees(&self, tenant: &str) -> bool {
        self.tenants.as_ref().is_none_or(|t| t.contains(tenant))
    }

    /// Whether it sees every tenant (the DLQ, tenant lists).
    pub fn sees_all(&self) -> bool {
        self.tenants.is_none()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    tokens: Vec<TokenEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    principal: String,
    /// SHA-256 of the token, hex (`printf %s "$TOKEN" | sha256sum`).
    token_sha256: String,
    roles: Vec<Role>,
    #[serde(default)]
    tenants: Vec<String>,
}

/// Tokens shorter than this are refused: they could be guessed.
pub const MIN_TOKEN_CHARS: usize = 24;

/// The API's authentication.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    /// SHA-256 (hex) of a token -> its identity. None: no API tokens.
    tokens: Option<HashMap<String, Identity>>,
    /// Bearer JWTs. None: none taken.
    jwt: Option<Arc<Jwt>>,
}

/// Why a request is not let in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No credentials, or credentials that match no token (401).
    Unauthenticated(String),
}

impl Auth {
    /// No authentication.
    pub fn none() -> Auth {
        Auth::default()
    }

    pub fn enabled(&self) -> bool {
        self.tokens.is_some() || self.jwt.is_some()
    }

    /// The authentication `http` configures: API tokens, JWTs, both, or none.
    pub fn from_settings(http: &ksched_runtime::settings::HttpSettings) -> Result<Auth> {
        let mut auth = match &http.tokens_file {
            Some(path) => Auth::from_file(path)?,
            None => Auth::none(),
        };
        if let Some(j) = &http.jwt {
            auth.jwt = Some(Arc::new(Jwt::new(j.clone())?));
        }
        Ok(auth)
    }

    /// Reads a tokens file.
    pub fn from_file(path: &Path) -> Result<Auth> {
        let bad = |detail: String| Error::Config {
            source_name: path.display().to_string(),
            detail,
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        Auth::parse(&text).map_err(bad)
    }

    /// Parses the text of a tokens file.
    pub fn parse(text: &str) -> std::result::Result<Auth, String> {
        let file: TokensFile = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        let mut tokens = HashMap::new();
        let mut principals = BTreeSet::new();
        for t in file.tokens {
            let hash = t.token_sha256.trim().to_ascii_lowercase();
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "token_sha256 of {} is not a SHA-256 in hex (printf %s \"$TOKEN\" | sha256sum)",
                    t.principal
                ));
            }
            if t.principal.trim().is_empty() || t.roles.is_empty() {
                return Err("every token needs a principal and at least one role".into());
            }
            if !principals.insert(t.principal.clone()) {
                return Err(format!("principal {} is listed twice", t.principal));
            }
            let identity = Identity {
                principal: Some(t.principal),
                roles: t.roles.into_iter().collect(),
                tenants: (!t.tenants.is_empty()).then(|| t.tenants.into_iter().collect()),
            };
            if tokens.insert(hash, identity).is_some() {
                return Err("two principals share a token".into());
            }
        }
        Ok(Auth {
            tokens: Some(tokens),
            jwt: None,
        })
    }

    /// The caller of a request with this `Authorization` header.
    pub fn identify(&self, authorization: Option<&str>) -> std::result::Result<Identity, Denied> {
        if !self.enabled() {
            return Ok(Identity::local());
        }
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Denied::Unauthenticated(
                    "an API token or JWT is required: Authorization: Bearer <token>".into(),
                )
            })?;
        // A JWT is three base64url parts; an API token has no dots.
        if let Some(jwt) = &self.jwt
            && token.split('.').count() == 3
        {
            return jwt.identify(token);
        }
        let Some(tokens) = &self.tokens else {
            return Err(Denied::Unauthenticated(
                "not a JWT; this API takes bearer JWTs only".into(),
            ));
        };
        if token.len() < MIN_TOKEN_CHARS {
            return Err(Denied::Unauthenticated("unknown API token".into()));
        }
        // The lookup is by the token's hash: how long it takes says nothing about the token.
        tokens
            .get(&sha256_hex(token.as_bytes()))
            .cloned()
            .ok_or_else(|| Denied::Unauthenticated("unknown API token".into()))
    }
}

/// Verifies bearer JWTs (`http.jwt`): signed with an asymmetric algorithm by a key of the
/// issuer's JWKS, for this audience, unexpired. The JWKS file is read again, at most once a
/// second, when a token names a key id it lacks (the issuer rotated its keys).
pub struct Jwt {
    settings: ksched_runtime::settings::JwtSettings,
    keys: RwLock<Keys>,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwt")
            .field("issuer", &self.settings.issuer)
            .finish_non_exhaustive()
    }
}

struct Keys {
    by_kid: HashMap<String, DecodingKey>,
    /// The only key, for tokens without `kid` when the set has one key.
    single: Option<DecodingKey>,
    read_at: Instant,
}

/// Signature algorithms taken: public-key ones only, so a token cannot be signed with a
/// key the verifier holds (HS256 with the public key as a secret).
fn asymmetric(alg: Algorithm) -> bool {
    !matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
}

impl Jwt {
    pub fn new(settings: ksched_runtime::settings::JwtSettings) -> Result<Jwt> {
        let keys = read_jwks(&settings.jwks_file)?;
        Ok(Jwt {
            settings,
            keys: RwLock::new(keys),
        })
    }

    fn key(&self, kid: Option<&str>) -> Option<DecodingKey> {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        match kid {
            Some(k) => keys.by_kid.get(k).cloned(),
            None => keys.single.clone(),
        }
    }

    /// Reads the JWKS again unless it was read within the last second.
    fn reload(&self) {
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        if keys.read_at.elapsed() < Duration::from_secs(1) {
            return;
        }
        match read_jwks(&self.settings.jwks_file) {
            Ok(k) => *keys = k,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the JWKS again; keeping the keys it had");
                keys.read_at = Instant::now();
            }
        }
    }

    pub fn identify(&self, token: &str) -> std::result::Result<Identity, Denied> {
        let denied = |why: String| Denied::Unauthenticated(format!("JWT refused: {why}"));
        let header = jsonwebtoken::decode_header(token).map_err(|e| denied(e.to_string()))?;
        if !asymmetric(header.alg) {
            return Err(denied(format!(
                "{:?} is not taken; tokens must be signed with a public-key algorithm",
                header.alg
            )));
        }
        let kid = header.kid.as_deref();
        let key = match self.key(kid) {
            Some(k) => k,
            None => {
                self.reload();
                self.key(kid)
                    .ok_or_else(|| denied(format!("no key {kid:?} in the issuer's JWKS")))?
            }
        };
        let s = &self.settings;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&s.issuer]);
        validation.set_audience(&[&s.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = s.leeway_s;
        validation.validate_nbf = true;
        let data = jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)
            .map_err(|e| denied(e.to_string()))?;
        let claims = data.claims;
        let principal = claims
            .get(&s.principal_claim)
            .and_then(|v| v.as_str())
            .filter(|p| !p.trim().is_empty())
            .ok_or_else(|| denied(format!("no {} claim", s.principal_claim)))?;
        let strings = |claim: &str| -> Option<Vec<String>> {
            match claims.get(claim)? {
                serde_json::Value::Array(a) => Some(
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect(),
                ),
                serde_json::Value::String(one) => Some(vec![one.clone()]),
                _ => Some(Vec::new()),
            }
        };
        let roles: BTreeSet<Role> = strings(&s.roles_claim)
            .unwrap_or_default()
            .iter()
            .filter_map(|r| serde_json::from_value(serde_json::Value::String(r.clone())).ok())
            .collect();
        if roles.is_empty() {
            return Err(denied(format!(
                "{principal} has no ksched role in its {} claim",
                s.roles_claim
            )));
        }
        Ok(Identity {
            principal: Some(principal.to_owned()),
            roles,
            tenants: strings(&s.tenants_claim).map(|t| t.into_iter().collect()),
        })
    }
}

fn read_jwks(path: &Path) -> Result<Keys> {
    let bad = |detail: String| Error::Config {
        source_name: path.display().to_string(),
        detail,
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read the JWKS: {e}")))?;
    let set: JwkSet =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a JSON Web Key Set: {e}")))?;
    let mut by_kid = HashMap::new();
    let mut usable = Vec::new();
    for jwk in &set.keys {
        // Symmetric keys are never verification keys here.
        if matches!(
            jwk.algorithm,
            jsonwebtoken::jwk::AlgorithmParameters::OctetKey(_)
        ) {
            continue;
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|e| bad(format!("a key: {e}")))?;
        if let Some(kid) = &jwk.common.key_id {
            by_kid.insert(kid.clone(), key.clone());
        }
        usable.push(key);
    }
    if usable.is_empty() {
        return Err(bad("the JWKS holds no public key".into()));
    }
    let single = (usable.len() == 1).then(|| usable.remove(0));
    Ok(Keys {
        by_kid,
        single,
        read_at: Instant::now(),
    })
}

/// The hosts a request's `Host` header may name when `http.allowed_hosts` is empty.
pub fn default_allowed_hosts(listen: &str) -> Vec<String> {
    let mut hosts = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "[::1]".to_owned(),
    ];
    if let Ok(addr) = listen.parse::<std::net::SocketAddr>()
        && !addr.ip().is_unspecified()
    {
        let ip = match addr.ip() {
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            v4 => v4.to_string(),
        };
        if !hosts.contains(&ip) {
            hosts.push(ip);
        }
    }
    hosts
}

/// Whether a `Host` header (with or without a port) names an allowed host.
pub fn host_allowed(host: Option<&str>, allowed: &[String]) -> bool {
    let Some(host) = host else {
        return false;
    };
    let name = if host.starts_with('[') {
        host.split_inclusive(']').next().unwrap_or(host)
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: &str = "alice-token-0123456789abcdef";
    const BOB: &str = "bob-token-0123456789abcdef00";

    fn auth() -> Auth {
        Auth::parse(&format!(
            "tokens:\n  - principal: alice\n    token_sha256: {}\n    roles: [approver]\n  - principal: bob\n    token_sha256: {}\n    roles: [viewer, operator]\n    tenants: [acme]\n",
            sha256_hex(ALICE.as_bytes()),
            sha256_hex(BOB.as_bytes()).to_uppercase(),
        ))
        .unwrap()
    }

    #[test]
    fn a_token_identifies_its_principal_and_nothing_else_gets_in() {
        let a = auth();
        let alice = a.identify(Some(&format!("Bearer {ALICE}"))).unwrap();
        assert_eq!(alice.principal.as_deref(), Some("alice"));
        assert!(alice.may(Action::Decide) && !alice.may(Action::Cancel));
        assert!(!alice.may(Action::Redrive), "an approver does not redrive");
        assert!(alice.sees("anyone") && alice.sees_all());
        let bob = a.identify(Some(&format!("Bearer {BOB}"))).unwrap();
        assert!(bob.may(Action::Cancel) && !bob.may(Action::Decide));
        assert!(bob.may(Action::Redrive), "an operator redrives");
        assert!(bob.sees("acme") && !bob.sees("globex") && !bob.sees_all());
        assert!(!bob.may(Action::Checkpoint));
        for bad in [
            None,
            Some("Bearer "),
            Some("Basic YWxpY2U6eA=="),
            Some(ALICE),
            Some("Bearer alice-token-0123456789abcdeX"),
            Some("Bearer short"),
        ] {
            assert!(
                matches!(a.identify(bad), Err(Denied::Unauthenticated(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn without_a_tokens_file_the_local_caller_may_do_everything() {
        let id = Auth::none().identify(None).unwrap();
        assert_eq!(id, Identity::local());
        assert!(id.may(Action::Checkpoint) && id.may(Action::Decide) && id.sees_all());
    }

    #[test]
    fn a_tokens_file_with_mistakes_is_refused() {
        let h = sha256_hex(ALICE.as_bytes());
        for (text, why) in [
            (
                "tokens:\n  - principal: a\n    token_sha256: abc\n    roles: [admin]\n".to_owned(),
                "not a SHA-256",
            ),
            (
                format!("tokens:\n  - principal: a\n    token_sha256: {h}\n    roles: []\n"),
                "at least one role",
            ),
            (
                format!("tokens:\n  - principal: a\n    token_sha256: {h}\n    roles: [root]\n"),
                "unknown variant",
            ),
            (
                format!(
                    "tokens:\n  - principal: a\n    token_sha256: {h}\n    roles: [admin]\n  - principal: b\n    token_sha256: {h}\n    roles: [viewer]\n"
                ),
                "share a token",
            ),
            (
                format!("tokens:\n  - principal: a\n    token: {ALICE}\n    roles: [admin]\n"),
                "unknown field",
            ),
        ] {
            let e = Auth::parse(&text).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn only_allowed_hosts_are_answered() {
        let allowed = default_allowed_hosts("127.0.0.1:8080");
        for ok in ["127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]:8080"] {
            assert!(host_allowed(Some(ok), &allowed), "{ok}");
        }
        for bad in [
            None,
            Some("evil.example"),
            Some("evil.example:8080"),
            Some("127.0.0.2"),
        ] {
            assert!(!host_allowed(bad, &allowed), "{bad:?}");
        }
        assert!(default_allowed_hosts("10.1.2.3:80").contains(&"10.1.2.3".to_owned()));
        assert_eq!(default_allowed_hosts("0.0.0.0:80").len(), 3);
    }

    /// An ES256 signing key and its JWK.
    struct Signer {
        key: jsonwebtoken::EncodingKey,
        jwk: serde_json::Value,
        kid: String,
    }

    fn signer(kid: &str) -> Signer {
        use base64::Engine as _;
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let point = pair.public_key().as_ref();
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        Signer {
            key: jsonwebtoken::EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwk: serde_json::json!({
                "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": kid,
                "x": b64(&point[1..33]), "y": b64(&point[33..65]),
            }),
            kid: kid.to_owned(),
        }
    }

    const ISSUER: &str = "https://idp.example";
    const AUDIENCE: &str = "ksched";

    fn now_s() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    /// Claims of a valid token for `sub`, an hour to live.
    fn claims(sub: &str) -> serde_json::Value {
        serde_json::json!({
            "iss": ISSUER, "aud": AUDIENCE, "sub": sub, "exp": now_s() + 3600,
            "ksched_roles": ["approver", "not-a-role"], "ksched_tenants": ["acme"],
        })
    }

    fn sign(s: &Signer, claims: &serde_json::Value) -> String {
        let mut header = jsonwebtoken::Header::new(Algorithm::ES256);
        header.kid = Some(s.kid.clone());
        jsonwebtoken::encode(&header, claims, &s.key).unwrap()
    }

    fn write_jwks(path: &Path, keys: &[&Signer]) {
        let set =
            serde_json::json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() });
        std::fs::write(path, set.to_string()).unwrap();
    }

    fn jwt_auth(jwks: &Path) -> Auth {
        let http = ksched_runtime::settings::HttpSettings {
            jwt: Some(ksched_runtime::settings::JwtSettings {
                issuer: ISSUER.into(),
                audience: AUDIENCE.into(),
                jwks_file: jwks.to_path_buf(),
                ..Default::default()
            }),
            ..Default::default()
        };
        Auth::from_settings(&http).unwrap()
    }

    fn bearer(t: &str) -> Option<String> {
        Some(format!("Bearer {t}"))
    }

    #[test]
    fn a_jwt_from_the_issuer_identifies_its_subject_roles_and_tenants() {
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("jwks.json");
        let k1 = signer("k1");
        write_jwks(&jwks, &[&k1]);
        let auth = jwt_auth(&jwks);
        assert!(auth.enabled());
        let id = auth
            .identify(bearer(&sign(&k1, &claims("carol"))).as_deref())
            .unwrap();
        assert_eq!(id.principal.as_deref(), Some("carol"));
        assert_eq!(
            id.roles,
            [Role::Approver].into(),
            "unknown role names are ignored"
        );
        assert!(id.sees("acme") && !id.sees("globex"));
        // Without a tenants claim: every tenant, as an API token without tenants.
        let mut c = claims("dave");
        c.as_object_mut().unwrap().remove("ksched_tenants");
        let id = auth.identify(bearer(&sign(&k1, &c)).as_deref()).unwrap();
        assert!(id.sees_all());
        // No API tokens configured: a non-JWT bearer is refused.
        assert!(auth.identify(bearer(ALICE).as_deref()).is_err());
        assert!(auth.identify(None).is_err());
    }

    #[test]
    fn a_jwt_that_is_expired_foreign_or_forged_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("jwks.json");
        let k1 = signer("k1");
        write_jwks(&jwks, &[&k1]);
        let auth = jwt_auth(&jwks);
        let refused = |token: String, why: &str| {
            let e = auth.identify(bearer(&token).as_deref()).unwrap_err();
            let Denied::Unauthenticated(text) = e;
            assert!(text.contains(why), "{why}: {text}");
        };
        let with = |key: &str, v: serde_json::Value| {
            let mut c = claims("carol");
            c[key] = v;
            c
        };
        refused(sign(&k1, &with("exp", (now_s() - 600).into())), "Expired");
        refused(sign(&k1, &with("aud", "another-app".into())), "Audience");
        refused(
            sign(&k1, &with("iss", "https://evil.example".into())),
            "Issuer",
        );
        refused(sign(&k1, &with("nbf", (now_s() + 600).into())), "Immature");
        refused(
            sign(&k1, &with("ksched_roles", serde_json::json!([]))),
            "no ksched role",
        );
        let mut no_sub = claims("x");
        no_sub.as_object_mut().unwrap().remove("sub");
        refused(sign(&k1, &no_sub), "no sub claim");
        // Signed by another key claiming k1's id.
        let mut forger = signer("k1");
        forger.kid = "k1".into();
        refused(sign(&forger, &claims("mallory")), "InvalidSignature");
        // HMAC, whatever the secret: never taken.
        let hs = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(Algorithm::HS256),
            &claims("mallory"),
            &jsonwebtoken::EncodingKey::from_secret(b"anything"),
        )
        .unwrap();
        refused(hs, "public-key algorithm");
        // Tampered payload.
        let good = sign(&k1, &claims("carol"));
        let other = sign(&k1, &claims("admin"));
        let tampered = format!(
            "{}.{}.{}",
            good.split('.').next().unwrap(),
            other.split('.').nth(1).unwrap(),
            good.split('.').nth(2).unwrap()
        );
        refused(tampered, "InvalidSignature");
    }

    #[test]
    fn a_rotated_key_is_picked_up_from_the_jwks_file() {
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("jwks.json");
        let (k1, k2) = (signer("k1"), signer("k2"));
        write_jwks(&jwks, &[&k1]);
        let auth = jwt_auth(&jwks);
        let t2 = sign(&k2, &claims("carol"));
        assert!(
            auth.identify(bearer(&t2).as_deref()).is_err(),
            "k2 unknown yet"
        );
        write_jwks(&jwks, &[&k1, &k2]);
        // Read again at most once a second.
        std::thread::sleep(Duration::from_millis(1100));
        let id = auth.identify(bearer(&t2).as_deref()).unwrap();
        assert_eq!(id.principal.as_deref(), Some("carol"));
    }

    #[test]
    fn api_tokens_and_jwts_work_side_by_side() {
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("jwks.json");
        let k1 = signer("k1");
        write_jwks(&jwks, &[&k1]);
        let tokens = dir.path().join("tokens.yaml");
        std::fs::write(
            &tokens,
            format!(
                "tokens:\n  - principal: alice\n    token_sha256: {}\n    roles: [approver]\n",
                sha256_hex(ALICE.as_bytes())
            ),
        )
        .unwrap();
        let http = ksched_runtime::settings::HttpSettings {
            tokens_file: Some(tokens),
            jwt: Some(ksched_runtime::settings::JwtSettings {
                issuer: ISSUER.into(),
                audience: AUDIENCE.into(),
                jwks_file: jwks,
                ..Default::default()
            }),
            ..Default::default()
        };
        let auth = Auth::from_settings(&http).unwrap();
        let alice = auth.identify(bearer(ALICE).as_deref()).unwrap();
        assert_eq!(alice.principal.as_deref(), Some("alice"));
        let carol = auth
            .identify(bearer(&sign(&k1, &claims("carol"))).as_deref())
            .unwrap();
        assert_eq!(carol.principal.as_deref(), Some("carol"));
    }

    #[test]
    fn a_jwks_without_public_keys_is_a_configuration_error() {
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("jwks.json");
        std::fs::write(
            &jwks,
            r#"{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"h1","alg":"HS256"}]}"#,
        )
        .unwrap();
        let e = Jwt::new(ksched_runtime::settings::JwtSettings {
            issuer: ISSUER.into(),
            audience: AUDIENCE.into(),
            jwks_file: jwks,
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("no public key"), "{e}");
    }
}
