//! The certificate pair as the kubelet updates a mounted Secret: files behind a `..data`
//! symbolic link swapped to a new directory.

use std::path::Path;

use neuron_e2e::https::SecretVolume;

use super::*;

fn testdata(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn der(pem: &[u8]) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem).expect("a PEM certificate")
}

/// The pair in a Secret volume (see `neuron_e2e::https::SecretVolume`).
fn secret_volume(cert: &[u8], key: &[u8]) -> SecretVolume {
    let dir = std::env::temp_dir().join(format!("neuron-tls-test-{:08x}", neuron_e2e::random_u32()));
    SecretVolume::new(dir, &[("tls.crt", cert), ("tls.key", key)]).expect("a Secret volume")
}

fn files(volume: &SecretVolume) -> CertificateFiles {
    CertificateFiles { cert: volume.path("tls.crt"), key: volume.path("tls.key") }
}

fn publish(volume: &mut SecretVolume, cert: &[u8], key: &[u8]) {
    volume.publish(&[("tls.crt", cert), ("tls.key", key)]).expect("publish");
}

#[tokio::test]
async fn loads_rsa_pkcs1_and_ec_sec1_pairs() {
    for name in ["a", "b"] {
        let (cert, key) = (testdata(&format!("{name}.crt")), testdata(&format!("{name}.key")));
        let volume = secret_volume(&cert, &key);
        let tls = Tls::load(files(&volume)).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(tls.served_certificate(), Some(der(&cert)), "{name}");
        assert_eq!(tls.config.alpn_protocols, vec![b"http/1.1".to_vec()], "HTTP/1.1 only");
    }
}

#[tokio::test]
async fn refuses_at_start_a_key_of_another_certificate_or_files_that_are_not_pem() {
    let volume = secret_volume(&testdata("a.crt"), &testdata("b.key"));
    assert!(matches!(Tls::load(files(&volume)).await, Err(TlsError::Key(_))), "mismatched pair");
    let volume = secret_volume(b"not a certificate", &testdata("a.key"));
    assert!(matches!(Tls::load(files(&volume)).await, Err(TlsError::NoCertificate { .. })));
    let volume = secret_volume(&testdata("a.crt"), b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n");
    assert!(Tls::load(files(&volume)).await.is_err(), "a key that does not parse");
    let huge = vec![b'A'; MAX_FILE_BYTES as usize + 1];
    let volume = secret_volume(&huge, &testdata("a.key"));
    assert!(matches!(Tls::load(files(&volume)).await, Err(TlsError::TooLarge { .. })));
    let missing = CertificateFiles { cert: "/nonexistent/tls.crt".into(), key: "/nonexistent/tls.key".into() };
    let error = Tls::load(missing).await.err().expect("missing files refused").to_string();
    assert!(error.contains("/nonexistent/tls.crt"), "the error names the file: {error}");
}

#[tokio::test]
async fn a_swapped_pair_is_served_and_a_half_updated_one_never() {
    let (a_crt, a_key, b_crt, b_key) = (testdata("a.crt"), testdata("a.key"), testdata("b.crt"), testdata("b.key"));
    let mut volume = secret_volume(&a_crt, &a_key);
    let tls = Tls::load(files(&volume)).await.expect("pair a");
    let mut last_bad = None;
    assert!(matches!(tls.check(&mut last_bad).await, Check::Unchanged));

    // Half-updated: b's certificate with a's key. Refused, a still served; the same bad
    // pair is reported once.
    publish(&mut volume, &b_crt, &a_key);
    assert!(matches!(tls.check(&mut last_bad).await, Check::Invalid(TlsError::Key(_))));
    assert_eq!(tls.served_certificate(), Some(der(&a_crt)));
    assert!(matches!(tls.check(&mut last_bad).await, Check::Unchanged), "counted once");

    // The whole new pair: served.
    publish(&mut volume, &b_crt, &b_key);
    assert!(matches!(tls.check(&mut last_bad).await, Check::Loaded));
    assert_eq!(tls.served_certificate(), Some(der(&b_crt)));
    assert!(matches!(tls.check(&mut last_bad).await, Check::Unchanged));

    // The files gone (a broken link): the last good pair stays.
    std::fs::remove_file(volume.dir.join("..data")).unwrap();
    assert!(matches!(tls.check(&mut last_bad).await, Check::Invalid(TlsError::Read { .. })));
    assert!(matches!(tls.check(&mut last_bad).await, Check::Unchanged), "counted once");
    assert_eq!(tls.served_certificate(), Some(der(&b_crt)));

    // Back to a: loaded again.
    publish(&mut volume, &a_crt, &a_key);
    assert!(matches!(tls.check(&mut last_bad).await, Check::Loaded));
    assert_eq!(tls.served_certificate(), Some(der(&a_crt)));
}
