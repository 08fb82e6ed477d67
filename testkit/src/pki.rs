//! Test certificates: a private CA and leaves it signed, as PEM files (needs `rcgen`).

/// A private CA, a server certificate for 127.0.0.1 and a client certificate, both
/// signed by it, written as PEM files under `dir`: (ca, server cert, server key, client
/// cert, client key).
pub fn write(dir: &std::path::Path) -> [std::path::PathBuf; 5] {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    // Distinct names: OpenSSL takes a leaf whose subject equals its issuer for self-signed.
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name
        .push(DnType::CommonName, "tranche test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |names: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, &names[0]);
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()]);
    let (client_cert, client_key) = leaf(vec!["worker".into()]);
    let files = [
        "ca.pem",
        "server.pem",
        "server.key",
        "client.pem",
        "client.key",
    ]
    .map(|f| dir.join(f));
    for (path, pem) in files.iter().zip([
        ca_cert.pem(),
        server_cert,
        server_key,
        client_cert,
        client_key,
    ]) {
        std::fs::write(path, pem).unwrap();
    }
    files
}
