//! The control plane's certificates and kubeconfigs, made fresh for each run (rcgen, ECDSA
//! P-256): one cluster CA that signs the API server's serving certificate and every client
//! certificate, and the service-account key pair the API server signs tokens with (and the
//! controller-manager's token controller too).
//!
//! Client identities are the ones Kubernetes' own components carry, so the API server's
//! authorizers treat them as they would on a cluster: `kubernetes-admin` in `system:masters`
//! (the test's setup only), `system:kube-controller-manager`, `system:kube-scheduler` (the
//! kubelet stand-in's binding) and `system:node:<name>` in `system:nodes` (the Node authorizer
//! and NodeRestriction apply to the kubelet stand-in).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

/// The CA, kept to sign more client certificates as the test needs them.
pub struct Pki {
    ca_cert: Certificate,
    ca_key: KeyPair,
    /// The CA certificate, PEM: the API server's `--client-ca-file` and every kubeconfig's
    /// `certificate-authority-data`.
    pub ca_pem: String,
    pub dir: PathBuf,
}

/// Files of one key pair with its certificate.
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub cert_pem: String,
    pub key_pem: String,
}

fn validity(p: &mut CertificateParams) {
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::hours(1);
    p.not_after = now + time::Duration::days(2);
}

impl Pki {
    /// A new CA, written to `dir/ca.crt`.
    pub fn new(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::default();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name
            .push(DnType::CommonName, "thaw-real-plane-ca");
        validity(&mut p);
        let ca_cert = p.self_signed(&ca_key).unwrap();
        let ca_pem = ca_cert.pem();
        std::fs::write(dir.join("ca.crt"), &ca_pem).unwrap();
        std::fs::write(dir.join("ca.key"), ca_key.serialize_pem()).unwrap();
        Pki {
            ca_cert,
            ca_key,
            ca_pem,
            dir: dir.to_owned(),
        }
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    pub fn ca_key_file(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    fn sign(&self, name: &str, mut p: CertificateParams) -> Pair {
        let key = KeyPair::generate().unwrap();
        validity(&mut p);
        let cert = p.signed_by(&key, &self.ca_cert, &self.ca_key).unwrap();
        let pair = Pair {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        std::fs::write(&pair.cert, &pair.cert_pem).unwrap();
        std::fs::write(&pair.key, &pair.key_pem).unwrap();
        pair
    }

    /// A serving certificate for these names and addresses.
    pub fn server(&self, name: &str, dns: &[&str], ips: &[Ipv4Addr]) -> Pair {
        let mut p = CertificateParams::default();
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, name);
        p.subject_alt_names = dns
            .iter()
            .map(|d| SanType::DnsName((*d).try_into().unwrap()))
            .chain(ips.iter().map(|ip| SanType::IpAddress((*ip).into())))
            .collect();
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(name, p)
    }

    /// A client certificate: the API server reads the user from the CN and the groups from O.
    pub fn client(&self, file: &str, user: &str, groups: &[&str]) -> Pair {
        let mut p = CertificateParams::default();
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, user);
        for g in groups {
            p.distinguished_name.push(DnType::OrganizationName, *g);
        }
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(file, p)
    }

    /// The service-account signing key (`sa.key`, PKCS#8) and its public half (`sa.pub`,
    /// SPKI: what `--service-account-key-file` parses for an EC key).
    pub fn service_account_keys(&self) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let private = self.dir.join("sa.key");
        let public = self.dir.join("sa.pub");
        std::fs::write(&private, key.serialize_pem()).unwrap();
        std::fs::write(&public, key.public_key_pem()).unwrap();
        (private, public)
    }

    /// A kubeconfig at `dir/{name}.kubeconfig` for `server` with this client certificate.
    pub fn kubeconfig(&self, name: &str, server: &str, pair: &Pair) -> PathBuf {
        let path = self.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            kubeconfig_yaml(
                server,
                &self.ca_pem,
                &format!(
                    "client-certificate-data: {}\n    client-key-data: {}",
                    b64(&pair.cert_pem),
                    b64(&pair.key_pem)
                ),
            ),
        )
        .unwrap();
        path
    }
}

/// A one-context kubeconfig; `auth` is the user's entries, indented for `users[0].user`.
pub fn kubeconfig_yaml(server: &str, ca_pem: &str, auth: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: plane\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: user\n  user:\n    {auth}\ncontexts:\n- name: plane\n  context:\n    cluster: plane\n    user: user\ncurrent-context: plane\n",
        ca = b64(ca_pem)
    )
}

pub fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A kube client from a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    kube::Client::try_from(config).unwrap()
}
