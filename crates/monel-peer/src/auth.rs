//! Keys, nonces and HMAC-SHA256 proofs for mutual challenge-response between Monel peers.
//!
//! Each side sends a fresh nonce; each proves it holds the shared key with an HMAC over both
//! nonces and what the exchange is about (a label, ranks, the message). Every part is
//! length-prefixed, so no two different lists of parts have the same proof. Keys for
//! narrower uses (a link, a data path) are derived from a wider one with [`Key::derive`].

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A fresh random challenge.
pub type Nonce = [u8; 16];

/// An HMAC-SHA256 proof.
pub type Proof = [u8; 32];

/// A 256-bit key. Its `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m
}

impl Key {
    /// The key a shared secret (any length) stands for.
    pub fn from_secret(secret: &[u8]) -> Self {
        Self(
            hmac(secret, &[b"monel secret"])
                .finalize()
                .into_bytes()
                .into(),
        )
    }

    /// A key for a narrower use, named by `label` and bound to `parts`.
    pub fn derive(&self, label: &str, parts: &[&[u8]]) -> Self {
        let mut all: Vec<&[u8]> = vec![b"derive", label.as_bytes()];
        all.extend_from_slice(parts);
        Self(hmac(&self.0, &all).finalize().into_bytes().into())
    }

    /// The proof of holding this key over `parts`.
    pub fn prove(&self, parts: &[&[u8]]) -> Proof {
        hmac(&self.0, parts).finalize().into_bytes().into()
    }

    /// Whether `got` is the proof over `parts` (compared in constant time).
    pub fn verify(&self, parts: &[&[u8]], got: &[u8]) -> bool {
        hmac(&self.0, parts).verify_slice(got).is_ok()
    }

    /// The key's bytes (for a cipher's key schedule).
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// A shared secret kept in a file: its bytes, a trailing newline ignored. An empty one is an
/// error (`InvalidData`), so that a blank file never stands for a secret.
pub fn secret_from_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let mut b = std::fs::read(path)?;
    while b.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
        b.pop();
    }
    if b.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the file is empty",
        ));
    }
    Ok(b)
}

/// A fresh nonce from the OS random generator.
pub fn nonce() -> Nonce {
    let mut n = [0u8; 16];
    getrandom::getrandom(&mut n).expect("OS random generator");
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_every_part_and_its_boundaries() {
        let k = Key::from_secret(b"s3cret");
        let p = k.prove(&[b"hello", b"ab", b"c"]);
        assert!(k.verify(&[b"hello", b"ab", b"c"], &p));
        // Moving a boundary changes the proof.
        assert!(!k.verify(&[b"hello", b"a", b"bc"], &p));
        assert!(!k.verify(&[b"hello", b"ab", b"d"], &p));
        assert!(!Key::from_secret(b"other").verify(&[b"hello", b"ab", b"c"], &p));
        assert_ne!(k.derive("link", &[b"1"]), k.derive("link", &[b"2"]));
        assert_ne!(k.derive("a", &[]), k.derive("b", &[]));
        assert_eq!(format!("{k:?}"), "Key(..)");
        assert_ne!(nonce(), nonce());
    }
}
