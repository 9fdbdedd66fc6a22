//! TLS client settings for each `sslmode`, on rustls.
//!
//! As in libpq, `prefer` and `require` encrypt without checking who is on
//! the other end; `verify-ca` checks the certificate chain against the
//! trusted roots; `verify-full` also checks that the certificate names the
//! host. Roots come from `sslrootcert`, else `~/.postgresql/root.crt`, else
//! the system's trust store.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use super::config::{PgConfig, SslMode};
use crate::error::{Error, ErrorKind, Result};

/// The rustls client configuration for `config.sslmode`, or `None` for
/// `disable`.
pub(crate) fn client_config(config: &PgConfig) -> Result<Option<Arc<ClientConfig>>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error("cannot set up TLS protocol versions").with_source(e))?;
    let verifier: Arc<dyn ServerCertVerifier> = match config.sslmode {
        SslMode::Disable => return Ok(None),
        SslMode::Prefer | SslMode::Require => Arc::new(EncryptOnly(provider)),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let roots = Arc::new(root_store(config)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| tls_error("cannot build the certificate verifier").with_source(e))?;
            if config.sslmode == SslMode::VerifyCa {
                Arc::new(ChainOnly(webpki))
            } else {
                webpki
            }
        }
    };
    let tls = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(Arc::new(tls)))
}

/// The name the server's certificate must carry under verify-full.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>> {
    ServerName::try_from(host.to_owned())
        .map_err(|e| tls_error(format!("{host:?} is not a valid TLS server name")).with_source(e))
}

fn root_store(config: &PgConfig) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let default_file = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".postgresql/root.crt"))
        .filter(|p| p.exists());
    if let Some(file) = config.sslrootcert.clone().or(default_file) {
        let certs = CertificateDer::pem_file_iter(&file)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| {
                tls_error("cannot read the sslrootcert file")
                    .with_context("file", file.display())
                    .with_source(e)
            })?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(
                tls_error("the sslrootcert file holds no usable certificate")
                    .with_context("file", file.display()),
            );
        }
    } else {
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        if roots.is_empty() {
            return Err(tls_error(
                "no trusted root certificates: set sslrootcert to the CA that signed the server's certificate",
            ));
        }
    }
    Ok(roots)
}

fn tls_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Tls, message)
}

/// `prefer` and `require`: encryption without authentication of the server,
/// as libpq does. Handshake signatures are still checked.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must be trusted; the host name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
