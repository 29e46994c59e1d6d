//! TLS for the HTTP API (`http.tls`, docs/security.md): rustls with the server's
//! certificate and key, and optionally mutual TLS (clients need a certificate the configured
//! CA signed). Connections are served one task each, the handshake bounded in time, so a
//! client that stalls its handshake holds up nobody else.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ksched_runtime::error::{Error, Result};
use ksched_runtime::settings::TlsSettings;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Longest a client may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn bad(path: &Path, detail: String) -> Error {
    Error::Config {
        source_name: path.display().to_string(),
        detail,
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(path, format!("cannot read certificates: {e}")))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(path, format!("not a PEM certificate: {e}")))?;
    if certs.is_empty() {
        return Err(bad(path, "holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// The server's TLS configuration, checked: the files read, the key matching the
/// certificate, the client CA (for mutual TLS) loaded.
pub fn server_config(s: &TlsSettings) -> Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(&s.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&s.key_file)
        .map_err(|e| bad(&s.key_file, format!("cannot read a PEM private key: {e}")))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&s.cert_file, format!("TLS versions: {e}")))?;
    let builder = match &s.client_ca_file {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates(ca)? {
                roots
                    .add(c)
                    .map_err(|e| bad(ca, format!("not a usable CA certificate: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| bad(ca, format!("client verifier: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        bad(
            &s.key_file,
            format!("the key does not fit the certificate: {e}"),
        )
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
