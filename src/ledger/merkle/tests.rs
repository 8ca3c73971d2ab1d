use super::*;

/// The leaves of RFC 6962's reference tests, as the certificate transparency projects publish
/// them, and the tree heads of their first 0 to 8.
const LEAVES: [&str; 8] = [
    "",
    "00",
    "10",
    "2021",
    "3031",
    "40414243",
    "5051525354555657",
    "606162636465666768696a6b6c6d6e6f",
];
const ROOTS: [&str; 9] = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
];

/// (leaf index, tree size, proof) from the same reference tests.
const INCLUSION: [(usize, usize, &[&str]); 4] = [
    (
        0,
        8,
        &[
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        5,
        8,
        &[
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (
        2,
        3,
        &["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"],
    ),
    (
        1,
        5,
        &[
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
];

/// (old size, new size, proof) from the same reference tests.
const CONSISTENCY: [(usize, usize, &[&str]); 4] = [
    (1, 1, &[]),
    (
        1,
        8,
        &[
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        6,
        8,
        &[
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (
        2,
        5,
        &[
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
];

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn hash(text: &str) -> Hash {
    unhex(text).try_into().unwrap()
}

fn reference_leaves() -> Vec<Hash> {
    LEAVES.iter().map(|leaf| leaf_hash(&unhex(leaf))).collect()
}

/// RFC 6962's MTH as the RFC writes it, recursion and all: the frontier must agree.
fn mth(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => Sha256::digest([]).into(),
        1 => leaves[0],
        n => {
            let k = split(n);
            node_hash(&mth(&leaves[..k]), &mth(&leaves[k..]))
        }
    }
}

/// A leaf per number, for trees of any size.
fn numbered(n: usize) -> Vec<Hash> {
    (0..n)
        .map(|i| leaf_hash(&(i as u64).to_be_bytes()))
        .collect()
}

#[test]
fn tree_heads_match_the_reference() {
    let leaves = reference_leaves();
    for (size, expected) in ROOTS.iter().enumerate() {
        assert_eq!(root(&leaves[..size]), hash(expected), "size {size}");
    }
}

#[test]
fn inclusion_proofs_match_the_reference_and_verify() {
    let leaves = reference_leaves();
    for (index, size, expected) in INCLUSION {
        let proof = inclusion_proof(index, &leaves[..size]).unwrap();
        let expected: Vec<Hash> = expected.iter().map(|h| hash(h)).collect();
        assert_eq!(proof, expected, "leaf {index} of {size}");
        let head = hash(ROOTS[size]);
        assert!(verify_inclusion(
            index as u64,
            size as u64,
            &leaves[index],
            &proof,
            &head
        ));
        assert!(!verify_inclusion(
            index as u64,
            size as u64,
            &leaves[index],
            &proof,
            &hash(ROOTS[0])
        ));
    }
    assert!(inclusion_proof(8, &leaves).is_none());
}

#[test]
fn consistency_proofs_match_the_reference_and_verify() {
    let leaves = reference_leaves();
    for (old, new, expected) in CONSISTENCY {
        let proof = consistency_proof(old, &leaves[..new]).unwrap();
        let expected: Vec<Hash> = expected.iter().map(|h| hash(h)).collect();
        assert_eq!(proof, expected, "{old} to {new}");
        assert!(verify_consistency(
            old as u64,
            new as u64,
            &proof,
            &hash(ROOTS[old]),
            &hash(ROOTS[new])
        ));
    }
    assert!(consistency_proof(0, &leaves).is_none());
    assert!(consistency_proof(9, &leaves).is_none());
}

#[test]
fn the_frontier_agrees_with_the_recursion_at_every_size() {
    let leaves = numbered(300);
    let mut frontier = Frontier::new();
    assert_eq!(frontier.root(), mth(&[]));
    for (i, leaf) in leaves.iter().enumerate() {
        frontier.push(*leaf);
        assert_eq!(frontier.size(), i as u64 + 1);
        assert_eq!(frontier.root(), mth(&leaves[..=i]), "size {}", i + 1);
        let again = Frontier::from_parts(frontier.size(), frontier.heads().to_vec()).unwrap();
        assert_eq!(again, frontier);
    }
    assert!(Frontier::from_parts(3, vec![leaves[0]]).is_none());
}

#[test]
fn every_proof_of_every_small_tree_verifies_and_no_altered_one_does() {
    for size in 1..=33 {
        let leaves = numbered(size);
        let head = mth(&leaves);
        for index in 0..size {
            let proof = inclusion_proof(index, &leaves).unwrap();
            let (i, n) = (index as u64, size as u64);
            assert!(
                verify_inclusion(i, n, &leaves[index], &proof, &head),
                "{index}/{size}"
            );
            assert!(!verify_inclusion(i, n, &leaf_hash(b"other"), &proof, &head));
            if size > 1 {
                assert!(!verify_inclusion(
                    (i + 1) % n,
                    n,
                    &leaves[index],
                    &proof,
                    &head
                ));
                let mut bent = proof.clone();
                bent[0][0] ^= 1;
                assert!(!verify_inclusion(i, n, &leaves[index], &bent, &head));
            }
        }
        for old in 1..=size {
            let proof = consistency_proof(old, &leaves).unwrap();
            let old_head = mth(&leaves[..old]);
            let (m, n) = (old as u64, size as u64);
            assert!(
                verify_consistency(m, n, &proof, &old_head, &head),
                "{old} to {size}"
            );
            if old < size {
                let mut forged = leaves.clone();
                forged[old - 1] = leaf_hash(b"rewritten");
                let forged_head = mth(&forged[..old]);
                assert!(!verify_consistency(m, n, &proof, &forged_head, &head));
                assert!(!verify_consistency(m, n, &proof, &old_head, &mth(&forged)));
                let mut bent = proof.clone();
                bent[0][31] ^= 1;
                assert!(!verify_consistency(m, n, &bent, &old_head, &head));
            }
        }
    }
}

#[test]
fn a_proof_is_at_most_a_hash_per_level() {
    let leaves = numbered(1000);
    let levels = (1000f64).log2().ceil() as usize;
    for index in [0, 1, 511, 512, 999] {
        assert!(inclusion_proof(index, &leaves).unwrap().len() <= levels);
    }
}
