//! Checkpoints as signed notes: the C2SP `tlog-checkpoint` body (origin, size, tree head)
//! signed in the C2SP `signed-note` format with an Ed25519 key the user holds.
//!
//! A note is its text, a blank line, and one line per signature:
//! `— <key name> <base64 of the key's 4-byte id and the signature>`. Keys are written as the
//! Go `sumdb/note` package writes them: `<name>+<id in hex>+<base64 of 0x01 and the key>`,
//! and a signer's as `PRIVATE+KEY+<name>+<id>+<base64 of 0x01 and the seed>`.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use sha2::{Digest as _, Sha256};

use super::merkle::Hash;

/// The algorithm byte of an Ed25519 key in a signed note.
const ED25519: u8 = 1;
/// What starts each signature line.
const DASH: &str = "\u{2014} ";

/// Why a note, a key or a checkpoint was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoteError {
    /// A key string that is not `name+id+key` (or `PRIVATE+KEY+name+id+seed`), or whose id
    /// does not match its name and key.
    #[error("malformed note key: {0}")]
    Key(&'static str),
    /// A note's text a signed note cannot hold (empty, no final newline, a blank line, a
    /// control character).
    #[error("malformed note text: {0}")]
    Text(&'static str),
    /// A note that is not text, a blank line and signature lines.
    #[error("malformed signed note: {0}")]
    Malformed(&'static str),
    /// No signature by the verifier's key, or one that does not verify.
    #[error("the note is not signed by {0}")]
    Unsigned(String),
    /// A checkpoint body that is not origin, size and base64 tree head.
    #[error("malformed checkpoint: {0}")]
    Checkpoint(&'static str),
}

/// A key name: not empty, no space, no `+`, nothing unprintable.
fn check_name(name: &str) -> Result<(), NoteError> {
    if name.is_empty()
        || name
            .chars()
            .any(|c| c == '+' || c.is_whitespace() || c.is_control())
    {
        return Err(NoteError::Key(
            "a key name is not empty and holds no space or '+'",
        ));
    }
    Ok(())
}

/// The id of an Ed25519 key: the first four bytes of SHA-256 of the name, a newline, the
/// algorithm byte and the public key.
fn key_id(name: &str, key: &VerifyingKey) -> u32 {
    let mut hasher = Sha256::new();
    hasher.update(name.as_bytes());
    hasher.update(b"\n");
    hasher.update([ED25519]);
    hasher.update(key.as_bytes());
    let digest = hasher.finalize();
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// Decodes `base64(0x01 || 32 bytes)`.
fn key_bytes(text: &str) -> Result<[u8; 32], NoteError> {
    let bytes = BASE64
        .decode(text)
        .map_err(|_| NoteError::Key("the key is not base64"))?;
    match bytes.split_first() {
        Some((&ED25519, key)) => key
            .try_into()
            .map_err(|_| NoteError::Key("an Ed25519 key is 32 bytes")),
        _ => Err(NoteError::Key("only Ed25519 keys (algorithm 1) are known")),
    }
}

/// Splits `name+id+key` and checks the id against the name and the key.
fn split_key(text: &str) -> Result<(&str, u32, &str), NoteError> {
    let mut parts = text.splitn(3, '+');
    let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(NoteError::Key("a key is name+id+key"));
    };
    check_name(name)?;
    if id.len() != 8 {
        return Err(NoteError::Key("a key's id is eight hex digits"));
    }
    let id = u32::from_str_radix(id, 16).map_err(|_| NoteError::Key("a key's id is hex"))?;
    Ok((name, id, key))
}

/// The key that signs checkpoints: an Ed25519 key and the name the signatures carry (by
/// convention the log's origin).
#[derive(Clone)]
pub struct NoteSigner {
    name: String,
    key: SigningKey,
    id: u32,
}

impl fmt::Debug for NoteSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NoteSigner")
            .field("name", &self.name)
            .field("id", &format_args!("{:08x}", self.id))
            .finish_non_exhaustive()
    }
}

impl NoteSigner {
    /// A signer from a 32-byte Ed25519 seed, which the caller keeps secret (generate it with
    /// any CSPRNG: `openssl rand 32`, `getrandom`).
    pub fn from_seed(name: &str, seed: [u8; 32]) -> Result<Self, NoteError> {
        check_name(name)?;
        let key = SigningKey::from_bytes(&seed);
        let id = key_id(name, &key.verifying_key());
        Ok(Self {
            name: name.to_owned(),
            key,
            id,
        })
    }

    /// A signer from its text, `PRIVATE+KEY+<name>+<id>+<base64 of 0x01 and the seed>`.
    pub fn parse(text: &str) -> Result<Self, NoteError> {
        let rest = text
            .strip_prefix("PRIVATE+KEY+")
            .ok_or(NoteError::Key("a signer key starts PRIVATE+KEY+"))?;
        let (name, id, seed) = split_key(rest)?;
        let signer = Self::from_seed(name, key_bytes(seed)?)?;
        if signer.id != id {
            return Err(NoteError::Key("the id does not match the name and key"));
        }
        Ok(signer)
    }

    /// The key that checks this signer's notes.
    pub fn verifier(&self) -> NoteVerifier {
        NoteVerifier {
            name: self.name.clone(),
            key: self.key.verifying_key(),
            id: self.id,
        }
    }

    /// The signed note of `text`: the text, a blank line and this key's signature line.
    pub fn sign(&self, text: &str) -> Result<String, NoteError> {
        check_text(text)?;
        let signature = self.key.sign(text.as_bytes());
        let mut blob = Vec::with_capacity(68);
        blob.extend_from_slice(&self.id.to_be_bytes());
        blob.extend_from_slice(&signature.to_bytes());
        Ok(format!(
            "{text}\n{DASH}{} {}\n",
            self.name,
            BASE64.encode(blob)
        ))
    }
}

/// The public half of a [`NoteSigner`]: what a verifier of checkpoints holds.
#[derive(Clone, PartialEq, Eq)]
pub struct NoteVerifier {
    name: String,
    key: VerifyingKey,
    id: u32,
}

impl fmt::Debug for NoteVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("NoteVerifier")
            .field(&self.to_string())
            .finish()
    }
}

/// `<name>+<id>+<base64 of 0x01 and the key>`, as [`NoteVerifier::parse`] reads it.
impl fmt::Display for NoteVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut bytes = vec![ED25519];
        bytes.extend_from_slice(self.key.as_bytes());
        write!(f, "{}+{:08x}+{}", self.name, self.id, BASE64.encode(bytes))
    }
}

impl NoteVerifier {
    /// A verifier from its text, `<name>+<id>+<base64 of 0x01 and the public key>`.
    pub fn parse(text: &str) -> Result<Self, NoteError> {
        let (name, id, key) = split_key(text)?;
        let key = VerifyingKey::from_bytes(&key_bytes(key)?)
            .map_err(|_| NoteError::Key("not an Ed25519 public key"))?;
        if key_id(name, &key) != id {
            return Err(NoteError::Key("the id does not match the name and key"));
        }
        Ok(Self {
            name: name.to_owned(),
            key,
            id,
        })
    }

    /// The key's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The text of `note` when one of its signatures is this key's and verifies. Signatures
    /// by other keys are skipped; one that names this key and does not verify refuses the
    /// note.
    pub fn open<'a>(&self, note: &'a str) -> Result<&'a str, NoteError> {
        let split = note
            .rfind("\n\n")
            .ok_or(NoteError::Malformed("no blank line before the signatures"))?;
        let (text, signatures) = (&note[..=split], &note[split + 2..]);
        check_text(text)?;
        if signatures.is_empty() || !signatures.ends_with('\n') {
            return Err(NoteError::Malformed("no signature lines"));
        }
        let mut signed = false;
        for line in signatures[..signatures.len() - 1].split('\n') {
            let line = line.strip_prefix(DASH).ok_or(NoteError::Malformed(
                "a signature line starts with an em dash",
            ))?;
            let (name, blob) = line.split_once(' ').ok_or(NoteError::Malformed(
                "a signature line is a name and a signature",
            ))?;
            let blob = BASE64
                .decode(blob)
                .map_err(|_| NoteError::Malformed("a signature is base64"))?;
            if blob.len() < 5 {
                return Err(NoteError::Malformed(
                    "a signature is its key's id and at least a byte",
                ));
            }
            let id = u32::from_be_bytes([blob[0], blob[1], blob[2], blob[3]]);
            if name != self.name || id != self.id {
                continue;
            }
            let signature = Signature::from_slice(&blob[4..])
                .map_err(|_| NoteError::Unsigned(self.name.clone()))?;
            self.key
                .verify_strict(text.as_bytes(), &signature)
                .map_err(|_| NoteError::Unsigned(self.name.clone()))?;
            signed = true;
        }
        if signed {
            Ok(text)
        } else {
            Err(NoteError::Unsigned(self.name.clone()))
        }
    }
}

/// A note's text: not empty, ending in a newline, no blank line, no control character but the
/// newlines.
fn check_text(text: &str) -> Result<(), NoteError> {
    if text.is_empty() || !text.ends_with('\n') {
        return Err(NoteError::Text("a note's text ends with a newline"));
    }
    if text.starts_with('\n') || text.contains("\n\n") {
        return Err(NoteError::Text("a note's text holds no blank line"));
    }
    if text.chars().any(|c| c.is_control() && c != '\n') {
        return Err(NoteError::Text("a note's text holds no control character"));
    }
    Ok(())
}

/// A log's state as a `tlog-checkpoint` says it: the log's origin (a name unique to it), how
/// many records it holds, and the head of their Merkle tree; extension lines after, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The log's name, unique to it: by convention a host name and path.
    pub origin: String,
    /// How many records the tree holds.
    pub size: u64,
    /// The head of the records' tree.
    pub root: Hash,
    /// Further lines, each not empty (a timestamp, say).
    pub extensions: Vec<String>,
}

impl Checkpoint {
    /// The checkpoint's text: origin, size and the base64 head, a line each, then the
    /// extensions.
    pub fn body(&self) -> String {
        let mut body = format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            BASE64.encode(self.root)
        );
        for line in &self.extensions {
            body.push_str(line);
            body.push('\n');
        }
        body
    }

    /// Reads a checkpoint's text.
    pub fn parse(body: &str) -> Result<Self, NoteError> {
        let mut lines = body
            .strip_suffix('\n')
            .ok_or(NoteError::Checkpoint("a checkpoint ends with a newline"))?
            .split('\n');
        let origin = lines
            .next()
            .filter(|origin| !origin.is_empty())
            .ok_or(NoteError::Checkpoint("the first line is the origin"))?;
        let size = lines
            .next()
            .filter(|size| {
                !size.is_empty()
                    && size.bytes().all(|b| b.is_ascii_digit())
                    && (*size == "0" || !size.starts_with('0'))
            })
            .and_then(|size| size.parse::<u64>().ok())
            .ok_or(NoteError::Checkpoint(
                "the second line is the size in decimal",
            ))?;
        let root = lines
            .next()
            .and_then(|root| BASE64.decode(root).ok())
            .and_then(|root| Hash::try_from(root).ok())
            .ok_or(NoteError::Checkpoint(
                "the third line is a base64 SHA-256 hash",
            ))?;
        let extensions: Vec<String> = lines.map(str::to_owned).collect();
        if extensions.iter().any(String::is_empty) {
            return Err(NoteError::Checkpoint("an extension line is not empty"));
        }
        Ok(Self {
            origin: origin.to_owned(),
            size,
            root,
            extensions,
        })
    }

    /// The checkpoint signed by `signer`, as a note. A checkpoint whose text would not read
    /// back as itself (an origin or an extension with a newline, or empty) is refused.
    pub fn sign(&self, signer: &NoteSigner) -> Result<String, NoteError> {
        let body = self.body();
        if Self::parse(&body).as_ref() != Ok(self) {
            return Err(NoteError::Checkpoint(
                "the origin and each extension are one line, not empty",
            ));
        }
        signer.sign(&body)
    }

    /// The checkpoint of a note signed by `verifier`'s key.
    pub fn open(note: &str, verifier: &NoteVerifier) -> Result<Self, NoteError> {
        Self::parse(verifier.open(note)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The example of the Go `sumdb/note` package's documentation, which the C2SP signed-note
    // specification follows.
    const SKEY: &str =
        "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz";
    const VKEY: &str = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
    const TEXT: &str = "If you think cryptography is the answer to your problem,\n\
                        then you don't know what your problem is.\n";
    const NOTE_SIGNATURE: &str = "\u{2014} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n";

    #[test]
    fn the_reference_note_is_signed_and_opened_byte_for_byte() {
        let signer = NoteSigner::parse(SKEY).unwrap();
        assert_eq!(signer.verifier().to_string(), VKEY);
        let note = signer.sign(TEXT).unwrap();
        assert_eq!(note, format!("{TEXT}\n{NOTE_SIGNATURE}"));
        let verifier = NoteVerifier::parse(VKEY).unwrap();
        assert_eq!(verifier.open(&note).unwrap(), TEXT);
    }

    #[test]
    fn an_altered_or_foreign_note_is_refused() {
        let verifier = NoteVerifier::parse(VKEY).unwrap();
        let note = format!("{TEXT}\n{NOTE_SIGNATURE}");
        let altered = note.replacen("answer", "Answer", 1);
        assert!(matches!(
            verifier.open(&altered),
            Err(NoteError::Unsigned(_))
        ));
        let other = NoteSigner::from_seed("PeterNeumann", [7; 32]).unwrap();
        let foreign = other.sign(TEXT).unwrap();
        assert!(matches!(
            verifier.open(&foreign),
            Err(NoteError::Unsigned(_))
        ));
        // A second signature by another key is skipped; ours still verifies.
        let both = format!("{note}{}", &foreign[TEXT.len() + 1..]);
        assert_eq!(verifier.open(&both).unwrap(), TEXT);
        assert!(matches!(verifier.open(TEXT), Err(NoteError::Malformed(_))));
    }

    #[test]
    fn keys_whose_id_does_not_match_are_refused() {
        assert!(NoteVerifier::parse(&VKEY.replace("c74f20a3", "c74f20a4")).is_err());
        assert!(NoteSigner::parse(&SKEY.replace("PeterNeumann", "PaulNeumann")).is_err());
        assert!(NoteSigner::from_seed("two words", [1; 32]).is_err());
        assert!(NoteSigner::parse(VKEY).is_err());
    }

    #[test]
    fn a_checkpoint_round_trips_and_its_forms_are_checked() {
        let signer = NoteSigner::from_seed("example.com/ledger", [3; 32]).unwrap();
        let checkpoint = Checkpoint {
            origin: "example.com/ledger".into(),
            size: 12,
            root: [9; 32],
            extensions: vec!["Timestamp: 1700000000".into()],
        };
        let note = checkpoint.sign(&signer).unwrap();
        assert!(note.starts_with("example.com/ledger\n12\nCQkJ"));
        assert_eq!(
            Checkpoint::open(&note, &signer.verifier()).unwrap(),
            checkpoint
        );
        for body in [
            "x\n012\nCQ==\n",
            "x\n-1\n\n",
            "\n1\nCQkJ\n",
            "x\n1\nnot base64\n",
            "x\n+12\nCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=\n",
        ] {
            assert!(Checkpoint::parse(body).is_err(), "{body:?}");
        }
        let lying = note.replacen("\n12\n", "\n13\n", 1);
        assert!(Checkpoint::open(&lying, &signer.verifier()).is_err());
        let crlf = note.replace("=\n", "=\r\n");
        assert!(Checkpoint::open(&crlf, &signer.verifier()).is_err());
        let two_lines = Checkpoint {
            origin: "a\nb".into(),
            ..checkpoint
        };
        assert!(two_lines.sign(&signer).is_err());
    }
}
