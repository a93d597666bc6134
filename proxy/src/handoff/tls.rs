//! Mutual TLS 1.3 on the MSR⇄MSR channel (`[handoff.tls]`): every MSR holds a
//! certificate from the operator's CA naming its MSR id (a DNS subjectAltName), so any
//! two MSRs of one operator authenticate each other with no key per pair.
//!
//! The connector checks the acceptor's certificate names the peer it wants (rustls
//! does, through the server name). The acceptor checks the connector's certificate
//! chains to the CA during the handshake, then reads the connector's short hello
//! (`itcp_proto::channel::tls_hello`) and checks that the certificate names the id the
//! hello claims. Nothing else the peer sends is read before both checks pass.
//!
//! Crypto provider: *ring* (a clean build of rustls with it took 34 s on the 2-core
//! build machine, with aws-lc-rs 79 s; see docs/results.md).

use std::io;
use std::path::Path;
use std::sync::Arc;

use itcp_config::ChannelTls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, DnsName, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// This MSR's TLS material, loaded once at start.
pub struct ChannelTlsConfig {
    connector: TlsConnector,
    acceptor: TlsAcceptor,
    /// Accept CA-signed MSRs that are not listed as peers.
    pub accept_unlisted: bool,
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

fn certs(path: &Path, what: &str) -> io::Result<Vec<CertificateDer<'static>>> {
    let v = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            invalid(format!(
                "[handoff.tls] {what} {}: {e} (expected PEM certificates)",
                path.display()
            ))
        })?;
    if v.is_empty() {
        return Err(invalid(format!(
            "[handoff.tls] {what} {}: no certificate in it (expected PEM \"BEGIN CERTIFICATE\")",
            path.display()
        )));
    }
    Ok(v)
}

/// True if the certificate names `id` (a DNS subjectAltName).
pub fn names(cert: &CertificateDer<'_>, id: &str) -> bool {
    let Ok(name) = DnsName::try_from(id.to_string()) else {
        return false;
    };
    webpki::EndEntityCert::try_from(cert)
        .and_then(|c| c.verify_is_valid_for_subject_name(&ServerName::DnsName(name)))
        .is_ok()
}

impl ChannelTlsConfig {
    /// Reads the CA, this MSR's certificate and key; errors name the file and what is
    /// wrong with it (also run by `msrd --check-config`).
    pub fn load(t: &ChannelTls, me: &str) -> io::Result<ChannelTlsConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for c in certs(&t.ca, "ca")? {
            roots.add(c).map_err(|e| {
                invalid(format!(
                    "[handoff.tls] ca {}: not a usable CA certificate: {e}",
                    t.ca.display()
                ))
            })?;
        }
        let roots = Arc::new(roots);
        let chain = certs(&t.cert, "cert")?;
        if !names(&chain[0], me) {
            return Err(invalid(format!(
                "[handoff.tls] cert {}: does not name this MSR (msr.id {me:?} must be one of \
                 its DNS subjectAltNames)",
                t.cert.display()
            )));
        }
        let key = PrivateKeyDer::from_pem_file(&t.key).map_err(|e| {
            invalid(format!(
                "[handoff.tls] key {}: {e} (expected a PEM private key: PKCS#8, SEC1 or PKCS#1)",
                t.key.display()
            ))
        })?;
        let tls13 = [&rustls::version::TLS13];
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| invalid(format!("[handoff.tls] ca {}: {e}", t.ca.display())))?;
        let bad_pair = |e: rustls::Error| {
            invalid(format!(
                "[handoff.tls] cert {} and key {}: {e}",
                t.cert.display(),
                t.key.display()
            ))
        };
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&tls13)
            .map_err(bad_pair)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(bad_pair)?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&tls13)
            .map_err(bad_pair)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(bad_pair)?;
        Ok(ChannelTlsConfig {
            connector: TlsConnector::from(Arc::new(client)),
            acceptor: TlsAcceptor::from(Arc::new(server)),
            accept_unlisted: t.accept_unlisted,
        })
    }

    /// The client half of the handshake: the peer's certificate must chain to the CA
    /// and name `peer`.
    pub async fn connect(
        &self,
        peer: &str,
        s: TcpStream,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = ServerName::try_from(peer.to_string())
            .map_err(|e| invalid(format!("peer id {peer:?} is not a DNS name: {e}")))?;
        self.connector.connect(name, s).await
    }

    /// The server half: the connector's certificate must chain to the CA. Which MSR it
    /// names is checked against its hello afterwards ([`names`]).
    pub async fn accept(
        &self,
        s: TcpStream,
    ) -> io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
        self.acceptor.accept(s).await
    }
}
