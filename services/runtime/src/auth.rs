//! Who calls the HTTP API and what they may do (docs/security.md). Identities come from API
//! tokens: `http.tokens_file` lists each principal with the SHA-256 of its token, its roles
//! and, for tenant-scoped principals, its tenants. The principal an approval, rejection or
//! cancellation is journaled with is the caller's, never a name from the request body.
//!
//! Without a tokens file the API has no authentication (`ksched run` then listens on
//! loopback only) and every caller is [`Identity::local`].

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use ksched_core::hash::sha256_hex;
use serde::Deserialize;

use crate::error::{Error, Result};

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
    Decide,
    Checkpoint,
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
            Action::Cancel => has(Role::Operator),
            Action::Decide => has(Role::Approver),
            Action::Checkpoint => has(Role::Admin),
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
    /// SHA-256 (hex) of a token -> its identity. None: no authentication.
    tokens: Option<HashMap<String, Identity>>,
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
        Auth { tokens: None }
    }

    pub fn enabled(&self) -> bool {
        self.tokens.is_some()
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
        })
    }

    /// The caller of a request with this `Authorization` header.
    pub fn identify(&self, authorization: Option<&str>) -> std::result::Result<Identity, Denied> {
        let Some(tokens) = &self.tokens else {
            return Ok(Identity::local());
        };
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Denied::Unauthenticated(
                    "an API token is required: Authorization: Bearer <token>".into(),
                )
            })?;
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
        assert!(alice.sees("anyone") && alice.sees_all());
        let bob = a.identify(Some(&format!("Bearer {BOB}"))).unwrap();
        assert!(bob.may(Action::Cancel) && !bob.may(Action::Decide));
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
}
