//! Client-side envelope encryption of job secrets, so that the scheduler never holds one.
//!
//! A job's secret env values (keys starting with `$`) are sealed by the producer before the
//! record leaves its machine and opened by the worker that runs the job; in between — the job
//! topic, the journal, RocksDB, dispatch topics, the DLQ, exports, logs — only the sealed form
//! exists, and the scheduler holds no key that could open it. The payload may be sealed the
//! same way (the scheduler routes on labels and meta, never on the payload).
//!
//! The scheme is envelope encryption, as in Confluent's client-side field encryption and
//! Temporal's payload codecs:
//!
//! - every tenant has key-encryption keys (KEKs, AES-256) in a [`Keyring`], one of them
//!   active; each has a key id (`kid`);
//! - each sealed value gets a fresh data key (DEK, AES-256), which encrypts the value
//!   (AES-256-GCM, the tenant and the field name as associated data, so a sealed value moved
//!   to another tenant's job or another field does not open) and is itself encrypted by the
//!   tenant's active KEK (the tenant and kid as associated data);
//! - the sealed value is text: `kse1.<kid>.<wrapped DEK>.<sealed value>` (base64url), so it
//!   fits the string-valued env map and the Avro schema is unchanged.
//!
//! Rotation adds a KEK and makes it active; values sealed under older KEKs still open as long
//! as those stay in the keyring. **Crypto-shredding**: deleting a tenant's KEKs
//! ([`Keyring::shred`]) makes every value ever sealed for it unreadable for good, without
//! rewriting the journal — provided no other copy of those keys survives (backups, other
//! hosts' keyrings). docs/security.md#secrets has the operations.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ksched_core::records::{JobRequest, is_secret_key};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

/// What every sealed value starts with (format version 1).
pub const PREFIX: &str = "kse1.";

const KEY_LEN: usize = 32;
const TAG_LEN: usize = 16;
/// A wrapped data key: nonce, encrypted key, tag.
const WRAPPED_LEN: usize = NONCE_LEN + KEY_LEN + TAG_LEN;
/// Longest key id.
const MAX_KID_LEN: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The text is not a sealed value.
    #[error("not a sealed value: {0}")]
    NotSealed(String),
    /// The keyring has no key to open it: never distributed here, retired, or shredded.
    #[error(
        "no key {kid} for tenant {tenant} in the keyring: it was never given to this host, or it was retired or shredded"
    )]
    NoKey { tenant: String, kid: String },
    /// The tenant has no active key to seal with.
    #[error("tenant {0} has no key in the keyring (ksched keys rotate --tenant {0})")]
    NoTenant(String),
    /// Authentication failed: tampered with, or sealed for another tenant or field.
    #[error(
        "{what} does not open with key {kid} of tenant {tenant}: it was altered, or sealed for another tenant or field"
    )]
    Tampered {
        what: String,
        tenant: String,
        kid: String,
    },
    #[error("keyring {path}: {message}")]
    Keyring { path: String, message: String },
    #[error("invalid keyring: {0}")]
    Invalid(String),
    #[error("the system random number generator failed")]
    Random,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a sealed value is bound to besides its tenant: it opens only as that field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field<'a> {
    /// An env value, by its key (e.g. `$DB_PASSWORD`).
    Env(&'a str),
    /// The job's payload.
    Payload,
}

impl Field<'_> {
    fn describe(self) -> String {
        match self {
            Field::Env(k) => format!("env {k}"),
            Field::Payload => "the payload".to_owned(),
        }
    }
}

/// A sealed value, parsed (nothing opened).
struct Sealed<'a> {
    kid: &'a str,
    wrapped: Vec<u8>,
    body: Vec<u8>,
}

fn valid_kid(kid: &str) -> bool {
    !kid.is_empty()
        && kid.len() <= MAX_KID_LEN
        && kid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn parse(text: &str) -> Result<Sealed<'_>> {
    let not = |why: &str| Err(Error::NotSealed(why.to_owned()));
    let Some(rest) = text.strip_prefix(PREFIX) else {
        return not("it does not start with kse1.");
    };
    let mut parts = rest.split('.');
    let (Some(kid), Some(wrapped), Some(body), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return not("it is not kse1.<kid>.<key>.<value>");
    };
    if !valid_kid(kid) {
        return not("its key id is not 1-64 letters, digits, - or _");
    }
    let (Ok(wrapped), Ok(body)) = (B64.decode(wrapped), B64.decode(body)) else {
        return not("it is not base64url");
    };
    if wrapped.len() != WRAPPED_LEN {
        return not("its data key has the wrong length");
    }
    if body.len() < NONCE_LEN + TAG_LEN {
        return not("it is too short");
    }
    Ok(Sealed { kid, wrapped, body })
}

/// Whether `text` has the form of a sealed value (nothing is opened: the scheduler, which
/// holds no key, checks that secrets reach it sealed).
pub fn is_sealed(text: &str) -> bool {
    parse(text).is_ok()
}

/// Whether a payload is a sealed value.
pub fn is_sealed_payload(payload: &[u8]) -> bool {
    payload.starts_with(PREFIX.as_bytes()) && std::str::from_utf8(payload).is_ok_and(is_sealed)
}

/// The secret env keys of `request` (and of its compensation, as `compensation.<key>`)
/// whose values are not sealed: what must not be journaled.
pub fn unsealed_secrets(request: &JobRequest) -> Vec<String> {
    let own = request
        .env
        .iter()
        .filter(|(k, v)| is_secret_key(k) && !is_sealed(v))
        .map(|(k, _)| k.clone());
    let compensation = request.compensation.iter().flat_map(|c| {
        c.env
            .iter()
            .filter(|(k, v)| is_secret_key(k) && !is_sealed(v))
            .map(|(k, _)| format!("compensation.{k}"))
    });
    own.chain(compensation).collect()
}

/// Whether opening `request` needs a keyring (a sealed secret or payload).
pub fn needs_keys(request: &JobRequest) -> bool {
    request
        .env
        .iter()
        .any(|(k, v)| is_secret_key(k) && is_sealed(v))
        || is_sealed_payload(&request.payload)
}

/// Associated data: length-prefixed parts, so boundaries cannot shift.
fn aad(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&(p.len() as u32).to_be_bytes());
        out.extend_from_slice(p);
    }
    out
}

fn field_aad(tenant: &str, field: Field<'_>) -> Vec<u8> {
    match field {
        Field::Env(key) => aad(&[b"ksched/env/v1", tenant.as_bytes(), key.as_bytes()]),
        Field::Payload => aad(&[b"ksched/payload/v1", tenant.as_bytes()]),
    }
}

fn dek_aad(tenant: &str, kid: &str) -> Vec<u8> {
    aad(&[b"ksched/dek/v1", tenant.as_bytes(), kid.as_bytes()])
}

fn aead_key(bytes: &[u8]) -> LessSafeKey {
    let key = UnboundKey::new(&AES_256_GCM, bytes)
        .unwrap_or_else(|_| unreachable!("keys are checked to be {KEY_LEN} bytes"));
    LessSafeKey::new(key)
}

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| Error::Random)?;
    Ok(b)
}

/// `nonce || ciphertext || tag` of `plaintext` under `key`, with a random nonce.
fn seal_with(key: &[u8], plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>> {
    let nonce = random::<NONCE_LEN>()?;
    let mut buf = plaintext.to_vec();
    aead_key(key)
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut buf,
        )
        .map_err(|_| Error::Random)?;
    let mut out = nonce.to_vec();
    out.extend_from_slice(&buf);
    Ok(out)
}

/// The plaintext of `nonce || ciphertext || tag`, if it authenticates.
fn open_with(key: &[u8], sealed: &[u8], aad: &[u8]) -> Option<Vec<u8>> {
    let (nonce, ct) = sealed.split_at_checked(NONCE_LEN)?;
    let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
    let mut buf = ct.to_vec();
    let plain = aead_key(key)
        .open_in_place(nonce, Aad::from(aad), &mut buf)
        .ok()?;
    Some(plain.to_vec())
}

/// One tenant's key-encryption keys.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantKeys {
    /// The key id new values are sealed with.
    active: String,
    /// Key id -> 32-byte key, base64url.
    keys: BTreeMap<String, String>,
}

/// Key-encryption keys per tenant: what producers seal with and workers open with. The
/// scheduler never needs one. Stored as JSON (`ksched keys` manages it), readable by its
/// owner only.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Keyring {
    tenants: BTreeMap<String, TenantKeys>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Key ids only: a keyring in a log line must not give its keys away.
        let mut m = f.debug_map();
        for (tenant, keys) in &self.tenants {
            m.entry(
                tenant,
                &format_args!("active {} of {:?}", keys.active, keys.keys.keys()),
            );
        }
        m.finish()
    }
}

/// A tenant as [`Keyring::tenants`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSummary {
    pub tenant: String,
    pub active: String,
    pub kids: Vec<String>,
}

impl Keyring {
    pub fn new() -> Keyring {
        Keyring::default()
    }

    /// A keyring from its JSON form, checked: every key 32 bytes, every active key present.
    pub fn from_json(text: &str) -> Result<Keyring> {
        let k: Keyring = serde_json::from_str(text).map_err(|e| Error::Invalid(e.to_string()))?;
        k.check()?;
        Ok(k)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| unreachable!("serializes: {e}"))
    }

    fn check(&self) -> Result<()> {
        for (tenant, t) in &self.tenants {
            if tenant.is_empty() {
                return Err(Error::Invalid("a tenant name is empty".into()));
            }
            if !t.keys.contains_key(&t.active) {
                return Err(Error::Invalid(format!(
                    "tenant {tenant}: active key {} is not among its keys",
                    t.active
                )));
            }
            for (kid, key) in &t.keys {
                if !valid_kid(kid) {
                    return Err(Error::Invalid(format!(
                        "tenant {tenant}: key id {kid:?} is not 1-64 letters, digits, - or _"
                    )));
                }
                if B64.decode(key).map(|k| k.len()).ok() != Some(KEY_LEN) {
                    return Err(Error::Invalid(format!(
                        "tenant {tenant}: key {kid} is not {KEY_LEN} bytes in base64url"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Reads a keyring file, refusing one that others than its owner may read (as ssh
    /// refuses a private key).
    pub fn load(path: &Path) -> Result<Keyring> {
        let err = |message: String| Error::Keyring {
            path: path.display().to_string(),
            message,
        };
        let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(err(format!(
                    "mode {mode:o} lets others read it: chmod 600 {}",
                    path.display()
                )));
            }
        }
        #[cfg(not(unix))]
        let _ = meta;
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        Keyring::from_json(&text).map_err(|e| err(e.to_string()))
    }

    /// Writes the keyring to `path` (mode 600), atomically: readers see the old file or the
    /// new one, never half of it.
    pub fn save(&self, path: &Path) -> Result<()> {
        let err = |message: String| Error::Keyring {
            path: path.display().to_string(),
            message,
        };
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = options.open(&tmp)?;
            f.write_all(self.to_json().as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(e.to_string())
        })
    }

    /// Tenants, their active key and every key id.
    pub fn tenants(&self) -> Vec<TenantSummary> {
        self.tenants
            .iter()
            .map(|(tenant, t)| TenantSummary {
                tenant: tenant.clone(),
                active: t.active.clone(),
                kids: t.keys.keys().cloned().collect(),
            })
            .collect()
    }

    /// Adds a fresh key for `tenant` (creating the tenant) and makes it the one new values
    /// are sealed with; older keys stay, so what they sealed still opens. Returns its id.
    pub fn rotate(&mut self, tenant: &str) -> Result<String> {
        if tenant.is_empty() {
            return Err(Error::Invalid("the tenant name is empty".into()));
        }
        let key = random::<KEY_LEN>()?;
        let id = random::<4>()?;
        let kid = format!(
            "k{}",
            id.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        let t = self
            .tenants
            .entry(tenant.to_owned())
            .or_insert_with(|| TenantKeys {
                active: kid.clone(),
                keys: BTreeMap::new(),
            });
        t.keys.insert(kid.clone(), B64.encode(key));
        t.active = kid.clone();
        Ok(kid)
    }

    /// Deletes one of a tenant's keys: what it sealed no longer opens. The active key cannot
    /// be retired (rotate first), so the tenant can still seal.
    pub fn retire(&mut self, tenant: &str, kid: &str) -> Result<()> {
        let t = self
            .tenants
            .get_mut(tenant)
            .ok_or_else(|| Error::NoTenant(tenant.to_owned()))?;
        if t.active == kid {
            return Err(Error::Invalid(format!(
                "{kid} is tenant {tenant}'s active key: rotate first, or shred the tenant"
            )));
        }
        t.keys.remove(kid).map(|_| ()).ok_or_else(|| Error::NoKey {
            tenant: tenant.to_owned(),
            kid: kid.to_owned(),
        })
    }

    /// Deletes every key of `tenant` (crypto-shredding): every value ever sealed for it stops
    /// opening, wherever it is stored. Returns how many keys went.
    pub fn shred(&mut self, tenant: &str) -> Result<usize> {
        self.tenants
            .remove(tenant)
            .map(|t| t.keys.len())
            .ok_or_else(|| Error::NoTenant(tenant.to_owned()))
    }

    fn key(&self, tenant: &str, kid: &str) -> Result<Vec<u8>> {
        self.tenants
            .get(tenant)
            .and_then(|t| t.keys.get(kid))
            .and_then(|k| B64.decode(k).ok())
            .ok_or_else(|| Error::NoKey {
                tenant: tenant.to_owned(),
                kid: kid.to_owned(),
            })
    }

    /// Seals `plaintext` as `field` of a job of `tenant`, with the tenant's active key.
    pub fn seal(&self, tenant: &str, field: Field<'_>, plaintext: &[u8]) -> Result<String> {
        let t = self
            .tenants
            .get(tenant)
            .ok_or_else(|| Error::NoTenant(tenant.to_owned()))?;
        let kek = self.key(tenant, &t.active)?;
        let dek = random::<KEY_LEN>()?;
        let wrapped = seal_with(&kek, &dek, &dek_aad(tenant, &t.active))?;
        let body = seal_with(&dek, plaintext, &field_aad(tenant, field))?;
        Ok(format!(
            "{PREFIX}{}.{}.{}",
            t.active,
            B64.encode(wrapped),
            B64.encode(body)
        ))
    }

    /// Opens a value sealed as `field` of a job of `tenant`.
    pub fn open(&self, tenant: &str, field: Field<'_>, sealed: &str) -> Result<Vec<u8>> {
        let s = parse(sealed)?;
        let kek = self.key(tenant, s.kid)?;
        let tampered = || Error::Tampered {
            what: field.describe(),
            tenant: tenant.to_owned(),
            kid: s.kid.to_owned(),
        };
        let dek = open_with(&kek, &s.wrapped, &dek_aad(tenant, s.kid)).ok_or_else(tampered)?;
        open_with(&dek, &s.body, &field_aad(tenant, field)).ok_or_else(tampered)
    }

    /// Seals every secret env value of `request` and of its compensation that is not sealed
    /// yet, and the payload too when `payload` is set. Returns how many values it sealed.
    pub fn seal_request(&self, request: &mut JobRequest, payload: bool) -> Result<usize> {
        let tenant = request.tenant_id.clone();
        let mut sealed = 0;
        let mut seal_env = |env: &mut BTreeMap<String, String>| -> Result<()> {
            for (k, v) in env.iter_mut() {
                if is_secret_key(k) && !is_sealed(v) {
                    *v = self.seal(&tenant, Field::Env(k), v.as_bytes())?;
                    sealed += 1;
                }
            }
            Ok(())
        };
        seal_env(&mut request.env)?;
        if let Some(c) = request.compensation.as_mut() {
            seal_env(&mut c.env)?;
        }
        if payload && !is_sealed_payload(&request.payload) {
            request.payload = self
                .seal(&tenant, Field::Payload, &request.payload)?
                .into_bytes();
            sealed += 1;
        }
        Ok(sealed)
    }

    /// The job's env and payload as its handler needs them: sealed values opened.
    pub fn open_request(&self, request: &JobRequest) -> Result<Opened> {
        open_request(Some(self), request)
    }
}

/// The env and payload of a job with its sealed values opened. Debug hides secret values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Opened {
    pub env: BTreeMap<String, String>,
    pub payload: Vec<u8>,
}

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened")
            .field("env", &ksched_core::records::redact_env(&self.env))
            .field("payload_bytes", &self.payload.len())
            .finish()
    }
}

/// Opens `request` with `keyring`; a request with nothing sealed needs none.
pub fn open_request(keyring: Option<&Keyring>, request: &JobRequest) -> Result<Opened> {
    let tenant = &request.tenant_id;
    let no_keyring = || Error::NoTenant(tenant.clone());
    let mut env = BTreeMap::new();
    for (k, v) in &request.env {
        let v = if is_secret_key(k) && is_sealed(v) {
            let keyring = keyring.ok_or_else(no_keyring)?;
            let plain = keyring.open(tenant, Field::Env(k), v)?;
            String::from_utf8(plain).map_err(|_| Error::Tampered {
                what: format!("env {k} (not UTF-8)"),
                tenant: tenant.clone(),
                kid: String::new(),
            })?
        } else {
            v.clone()
        };
        env.insert(k.clone(), v);
    }
    let payload = if is_sealed_payload(&request.payload) {
        let text = std::str::from_utf8(&request.payload).unwrap_or_default();
        keyring
            .ok_or_else(no_keyring)?
            .open(tenant, Field::Payload, text)?
    } else {
        request.payload.clone()
    };
    Ok(Opened { env, payload })
}

/// A keyring file that long-running processes (workers) read again when it changes, so a
/// rotation reaches them, and a shredding takes their keys away, without a restart.
#[derive(Debug)]
pub struct KeyringFile {
    path: PathBuf,
    cached: Mutex<Option<(FileStamp, Arc<Keyring>)>>,
}

/// What tells a changed file: modification time and length.
type FileStamp = (Option<SystemTime>, u64);

impl KeyringFile {
    /// Reads `path` now, so that a bad keyring fails at start.
    pub fn open(path: &Path) -> Result<KeyringFile> {
        let file = KeyringFile {
            path: path.to_owned(),
            cached: Mutex::new(None),
        };
        file.current()?;
        Ok(file)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The keyring as the file holds it now (read again only if the file changed).
    pub fn current(&self) -> Result<Arc<Keyring>> {
        let meta = std::fs::metadata(&self.path).map_err(|e| Error::Keyring {
            path: self.path.display().to_string(),
            message: e.to_string(),
        })?;
        let stamp = (meta.modified().ok(), meta.len());
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((s, k)) = cached.as_ref()
            && *s == stamp
        {
            return Ok(k.clone());
        }
        let k = Arc::new(Keyring::load(&self.path)?);
        *cached = Some((stamp, k.clone()));
        Ok(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ksched_core::records::JobTemplate;

    fn ring_for(tenants: &[&str]) -> Keyring {
        let mut k = Keyring::new();
        for t in tenants {
            k.rotate(t).unwrap();
        }
        k
    }

    fn request(tenant: &str) -> JobRequest {
        let mut r = JobRequest {
            job_id: format!("{tenant}:job-1"),
            tenant_id: tenant.into(),
            payload: b"the payload".to_vec(),
            ..JobRequest::default()
        };
        r.env.insert("$TOKEN".into(), "s3cret-value".into());
        r.env.insert("MODE".into(), "fast".into());
        r
    }

    #[test]
    fn a_sealed_value_opens_for_its_tenant_and_field_only() {
        let k = ring_for(&["acme", "globex"]);
        let s = k.seal("acme", Field::Env("$TOKEN"), b"s3cret").unwrap();
        assert!(s.starts_with(PREFIX) && is_sealed(&s));
        assert!(!s.contains("s3cret"));
        assert_eq!(k.open("acme", Field::Env("$TOKEN"), &s).unwrap(), b"s3cret");
        // Another tenant's job: its keyring entry has no such kid.
        assert!(matches!(
            k.open("globex", Field::Env("$TOKEN"), &s),
            Err(Error::NoKey { .. })
        ));
        // Another field of the same tenant's job.
        assert!(matches!(
            k.open("acme", Field::Env("$OTHER"), &s),
            Err(Error::Tampered { .. })
        ));
        assert!(matches!(
            k.open("acme", Field::Payload, &s),
            Err(Error::Tampered { .. })
        ));
    }

    #[test]
    fn the_same_value_seals_differently_each_time() {
        let k = ring_for(&["acme"]);
        let a = k.seal("acme", Field::Env("$T"), b"x").unwrap();
        let b = k.seal("acme", Field::Env("$T"), b"x").unwrap();
        assert_ne!(a, b, "fresh data key and nonce per value");
    }

    #[test]
    fn a_kid_copied_into_another_tenants_keyring_entry_does_not_open() {
        // Even if two tenants shared a key id and key material, the tenant is bound in.
        let mut k = ring_for(&["acme"]);
        let acme = k.tenants.get("acme").unwrap().clone();
        k.tenants.insert("globex".into(), acme);
        let s = k.seal("acme", Field::Env("$T"), b"x").unwrap();
        assert!(matches!(
            k.open("globex", Field::Env("$T"), &s),
            Err(Error::Tampered { .. })
        ));
    }

    #[test]
    fn any_altered_byte_is_detected() {
        let k = ring_for(&["acme"]);
        let s = k.seal("acme", Field::Env("$T"), b"secret").unwrap();
        let (head, body) = s.rsplit_once('.').unwrap();
        let mut raw = B64.decode(body).unwrap();
        for i in 0..raw.len() {
            raw[i] ^= 1;
            let altered = format!("{head}.{}", B64.encode(&raw));
            assert!(
                k.open("acme", Field::Env("$T"), &altered).is_err(),
                "byte {i}"
            );
            raw[i] ^= 1;
        }
    }

    #[test]
    fn rotation_keeps_old_values_opening_and_seals_with_the_new_key() {
        let mut k = ring_for(&["acme"]);
        let old = k.seal("acme", Field::Env("$T"), b"v1").unwrap();
        let old_kid = k.tenants()[0].active.clone();
        let new_kid = k.rotate("acme").unwrap();
        assert_ne!(old_kid, new_kid);
        let new = k.seal("acme", Field::Env("$T"), b"v2").unwrap();
        assert!(new.starts_with(&format!("{PREFIX}{new_kid}.")));
        assert_eq!(k.open("acme", Field::Env("$T"), &old).unwrap(), b"v1");
        // Retiring the old key: what it sealed is gone, what the new one sealed is not.
        assert!(k.retire("acme", &new_kid).is_err(), "the active key stays");
        k.retire("acme", &old_kid).unwrap();
        assert!(matches!(
            k.open("acme", Field::Env("$T"), &old),
            Err(Error::NoKey { .. })
        ));
        assert_eq!(k.open("acme", Field::Env("$T"), &new).unwrap(), b"v2");
    }

    #[test]
    fn shredding_a_tenant_makes_its_values_unreadable_and_spares_others() {
        let mut k = ring_for(&["acme", "globex"]);
        let a = k.seal("acme", Field::Env("$T"), b"a").unwrap();
        let g = k.seal("globex", Field::Env("$T"), b"g").unwrap();
        assert_eq!(k.shred("acme").unwrap(), 1);
        assert!(matches!(
            k.open("acme", Field::Env("$T"), &a),
            Err(Error::NoKey { .. })
        ));
        assert!(matches!(
            k.seal("acme", Field::Env("$T"), b"a"),
            Err(Error::NoTenant(_))
        ));
        assert_eq!(k.open("globex", Field::Env("$T"), &g).unwrap(), b"g");
        // The keyring as saved after shredding holds nothing of the tenant.
        assert!(!k.to_json().contains("acme"));
    }

    #[test]
    fn requests_seal_their_secrets_and_open_back() {
        let k = ring_for(&["acme"]);
        let mut r = request("acme");
        r.compensation = Some(Box::new(JobTemplate {
            env: [("$UNDO".to_owned(), "undo-secret".to_owned())].into(),
            ..JobTemplate::default()
        }));
        assert_eq!(unsealed_secrets(&r), ["$TOKEN", "compensation.$UNDO"]);
        assert!(!needs_keys(&r));
        assert_eq!(k.seal_request(&mut r, true).unwrap(), 3);
        assert!(unsealed_secrets(&r).is_empty());
        assert!(needs_keys(&r));
        assert_eq!(r.env["MODE"], "fast", "plain env stays plain");
        let text = format!("{r:?}");
        for secret in ["s3cret-value", "undo-secret", "the payload"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        // Sealing again seals nothing twice.
        assert_eq!(k.seal_request(&mut r, true).unwrap(), 0);
        let opened = k.open_request(&r).unwrap();
        assert_eq!(opened.env["$TOKEN"], "s3cret-value");
        assert_eq!(opened.env["MODE"], "fast");
        assert_eq!(opened.payload, b"the payload");
        assert!(!format!("{opened:?}").contains("s3cret-value"));
        // Without a keyring, a sealed request does not open; a plain one does.
        assert!(matches!(open_request(None, &r), Err(Error::NoTenant(_))));
        let plain = JobRequest {
            env: [("MODE".to_owned(), "x".to_owned())].into(),
            ..JobRequest::default()
        };
        assert_eq!(open_request(None, &plain).unwrap().env["MODE"], "x");
    }

    #[test]
    fn hidden_markers_and_look_alikes_are_not_sealed() {
        let k = ring_for(&["acme"]);
        let good = k.seal("acme", Field::Env("$T"), b"x").unwrap();
        assert!(is_sealed(&good));
        let (head, _) = good.rsplit_once('.').unwrap();
        for text in [
            "*hidden*",
            "s3cret",
            "",
            "kse1.",
            "kse1.kid.AAAA.AAAA",
            "kse1.kid..",
            &format!("{head}.!!!!"),
            &format!("{head}.AAAA"),
            &format!("{good}.extra"),
            &good.replacen("kse1.", "kse2.", 1),
            &good.replacen("kse1.k", "kse1.k/", 1),
        ] {
            assert!(!is_sealed(text), "{text:?}");
        }
        assert!(is_sealed_payload(good.as_bytes()));
        assert!(!is_sealed_payload(b"kse1.not really"));
    }

    #[test]
    fn the_keyring_file_round_trips_and_refuses_loose_permissions() {
        let dir = std::env::temp_dir().join(format!("ksched-keyring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keyring.json");
        let k = ring_for(&["acme"]);
        k.save(&path).unwrap();
        let loaded = Keyring::load(&path).unwrap();
        let s = k.seal("acme", Field::Env("$T"), b"x").unwrap();
        assert_eq!(loaded.open("acme", Field::Env("$T"), &s).unwrap(), b"x");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o600
            );
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = Keyring::load(&path).unwrap_err().to_string();
            assert!(e.contains("chmod 600"), "{e}");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        // A file that follows the keyring: shredding reaches a running reader.
        let file = KeyringFile::open(&path).unwrap();
        assert!(
            file.current()
                .unwrap()
                .open("acme", Field::Env("$T"), &s)
                .is_ok()
        );
        let mut shredded = k.clone();
        shredded.shred("acme").unwrap();
        shredded.rotate("other-tenant").unwrap();
        shredded.save(&path).unwrap();
        assert!(
            file.current()
                .unwrap()
                .open("acme", Field::Env("$T"), &s)
                .is_err()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn keyrings_that_do_not_hold_together_are_refused() {
        for bad in [
            r#"{"tenants":{"a":{"active":"k1","keys":{}}}}"#,
            r#"{"tenants":{"a":{"active":"k1","keys":{"k1":"c2hvcnQ"}}}}"#,
            r#"{"tenants":{"a":{"active":"k/1","keys":{"k/1":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}}}}"#,
            r#"{"tenants":{},"extra":1}"#,
        ] {
            assert!(Keyring::from_json(bad).is_err(), "{bad}");
        }
        assert!(
            Keyring::from_json(
                r#"{"tenants":{"a":{"active":"k1","keys":{"k1":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}}}}"#
            )
            .is_ok()
        );
    }

    #[test]
    fn debug_never_shows_key_material() {
        let k = ring_for(&["acme"]);
        let json = k.to_json();
        let key = json.split('"').find(|s| s.len() == 43).unwrap().to_owned();
        assert!(!format!("{k:?}").contains(&key));
    }
}
