//! RFC 6962 Merkle hashing: leaves and nodes, the tree head of a log, inclusion and
//! consistency proofs and their verification (RFC 9162, sections 2.1.3 and 2.1.4).
//!
//! Every function takes leaf *hashes*: a record becomes a leaf once, with [`leaf_hash`], and
//! the tree is built over those.

use sha2::{Digest as _, Sha256};

/// A SHA-256 hash: a leaf's, a node's, or a tree head.
pub type Hash = [u8; 32];

/// The hash of a leaf: SHA-256 of `0x00` and the leaf's bytes.
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut hasher = Sha256::new();
    hasher.update([0u8]);
    hasher.update(data);
    hasher.finalize().into()
}

/// The hash of an interior node: SHA-256 of `0x01`, the left child and the right.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut hasher = Sha256::new();
    hasher.update([1u8]);
    hasher.update(left);
    hasher.update(right);
    hasher.finalize().into()
}

/// The head of the tree over `leaves` (RFC 6962's MTH); SHA-256 of nothing for no leaf.
pub fn root(leaves: &[Hash]) -> Hash {
    let mut frontier = Frontier::new();
    for leaf in leaves {
        frontier.push(*leaf);
    }
    frontier.root()
}

/// The right edge of a growing tree: the heads of its perfect subtrees, largest first, one
/// per bit set in its size. It takes leaves one at a time and knows the tree's head at every
/// size, in memory logarithmic in the size: a log's checkpoint is its frontier's root, and a
/// verifier that trusts a frontier (its root matches a signed checkpoint) checks the records
/// after it without reading the ones before.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frontier {
    size: u64,
    heads: Vec<Hash>,
}

impl Frontier {
    /// The frontier of the empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// A frontier as stored beside a checkpoint: the tree's size and its subtrees' heads,
    /// largest first. `None` when the count of heads is not the count of bits set in `size`.
    pub fn from_parts(size: u64, heads: Vec<Hash>) -> Option<Self> {
        (heads.len() == size.count_ones() as usize).then_some(Self { size, heads })
    }

    /// How many leaves the tree holds.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The heads of the perfect subtrees, largest first.
    pub fn heads(&self) -> &[Hash] {
        &self.heads
    }

    /// Appends a leaf (its hash).
    pub fn push(&mut self, leaf: Hash) {
        let mut head = leaf;
        // Each trailing one bit of the old size is a subtree of the new leaf's size: merge.
        let mut merges = self.size.trailing_ones();
        while merges > 0 {
            let left = self.heads.pop().expect("one head per bit set in the size");
            head = node_hash(&left, &head);
            merges -= 1;
        }
        self.heads.push(head);
        self.size += 1;
    }

    /// The tree's head: the subtrees folded from the smallest.
    pub fn root(&self) -> Hash {
        let mut heads = self.heads.iter().rev();
        let Some(last) = heads.next() else {
            return Sha256::digest([]).into();
        };
        heads.fold(*last, |right, left| node_hash(left, &right))
    }
}

/// The largest power of two below `n` (for `n` ≥ 2): where RFC 6962 splits a tree.
fn split(n: usize) -> usize {
    debug_assert!(n >= 2);
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

/// The inclusion proof of leaf `index` in the tree over `leaves` (RFC 6962's PATH), or `None`
/// when the index is outside the tree.
pub fn inclusion_proof(index: usize, leaves: &[Hash]) -> Option<Vec<Hash>> {
    (index < leaves.len()).then(|| {
        let mut proof = Vec::new();
        path(index, leaves, &mut proof);
        proof
    })
}

fn path(index: usize, leaves: &[Hash], proof: &mut Vec<Hash>) {
    if leaves.len() <= 1 {
        return;
    }
    let k = split(leaves.len());
    if index < k {
        path(index, &leaves[..k], proof);
        proof.push(root(&leaves[k..]));
    } else {
        path(index - k, &leaves[k..], proof);
        proof.push(root(&leaves[..k]));
    }
}

/// The proof that the tree of the first `old_size` of `leaves` is a prefix of the tree over
/// all of them (RFC 6962's PROOF), or `None` when `old_size` is 0 or larger than the tree.
pub fn consistency_proof(old_size: usize, leaves: &[Hash]) -> Option<Vec<Hash>> {
    (old_size >= 1 && old_size <= leaves.len()).then(|| {
        let mut proof = Vec::new();
        subproof(old_size, leaves, true, &mut proof);
        proof
    })
}

fn subproof(m: usize, leaves: &[Hash], whole: bool, proof: &mut Vec<Hash>) {
    let n = leaves.len();
    if m == n {
        if !whole {
            proof.push(root(leaves));
        }
        return;
    }
    let k = split(n);
    if m <= k {
        subproof(m, &leaves[..k], whole, proof);
        proof.push(root(&leaves[k..]));
    } else {
        subproof(m - k, &leaves[k..], false, proof);
        proof.push(root(&leaves[..k]));
    }
}

/// Whether `proof` shows the leaf `leaf` at `index` in the tree of `size` leaves whose head is
/// `root` (RFC 9162, 2.1.3.2).
pub fn verify_inclusion(index: u64, size: u64, leaf: &Hash, proof: &[Hash], root: &Hash) -> bool {
    if index >= size {
        return false;
    }
    let (mut fn_, mut sn) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if sn == 0 {
            return false;
        }
        if fn_ & 1 == 1 || fn_ == sn {
            r = node_hash(p, &r);
            if fn_ & 1 == 0 {
                while fn_ & 1 == 0 && fn_ != 0 {
                    fn_ >>= 1;
                    sn >>= 1;
                }
            }
        } else {
            r = node_hash(&r, p);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    sn == 0 && r == *root
}

/// Whether `proof` shows the tree of `old_size` leaves with head `old_root` to be a prefix of
/// the tree of `new_size` leaves with head `new_root` (RFC 9162, 2.1.4.2). Equal sizes need an
/// empty proof and equal heads; every tree extends the empty one.
pub fn verify_consistency(
    old_size: u64,
    new_size: u64,
    proof: &[Hash],
    old_root: &Hash,
    new_root: &Hash,
) -> bool {
    if old_size > new_size {
        return false;
    }
    if old_size == new_size {
        return proof.is_empty() && old_root == new_root;
    }
    if old_size == 0 {
        return proof.is_empty();
    }
    let mut path: Vec<&Hash> = Vec::with_capacity(proof.len() + 1);
    if old_size.is_power_of_two() {
        path.push(old_root);
    }
    path.extend(proof);
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    let (mut fn_, mut sn) = (old_size - 1, new_size - 1);
    while fn_ & 1 == 1 {
        fn_ >>= 1;
        sn >>= 1;
    }
    let (mut fr, mut sr) = (**first, **first);
    for c in rest {
        if sn == 0 {
            return false;
        }
        if fn_ & 1 == 1 || fn_ == sn {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while fn_ & 1 == 0 && fn_ != 0 {
                fn_ >>= 1;
                sn >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    fr == *old_root && sr == *new_root && sn == 0
}

#[cfg(test)]
mod tests;
