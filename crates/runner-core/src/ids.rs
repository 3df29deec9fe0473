//! Session ids: 12 characters of the lowercase RFC 4648 base32 alphabet (about
//! 60 random bits), safe as a DNS label and inside Kubernetes object names.

const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
pub const SESSION_ID_LEN: usize = 12;

/// A map keyed by session id. Every edge request looks its session up
/// (the registry, the edge's per-session slots): a fast seeded hash rather
/// than SipHash, which cost more than the lookup itself. The keys are the
/// runner's own random ids, so no client chooses what collides.
pub(crate) type IdMap<V> = std::collections::HashMap<String, V, foldhash::fast::RandomState>;

pub fn new_session_id() -> String {
    let bytes: [u8; SESSION_ID_LEN] = rand::random();
    // 256 is a multiple of 32, so `% 32` is unbiased.
    bytes
        .iter()
        .map(|b| ALPHABET[(*b % 32) as usize] as char)
        .collect()
}

/// The length of a workload token (0.16): 160 random bits.
pub const WORKLOAD_TOKEN_LEN: usize = 32;

/// A workload token: 32 characters of the session-id alphabet.
pub fn new_workload_token() -> String {
    let bytes: [u8; WORKLOAD_TOKEN_LEN] = rand::random();
    bytes
        .iter()
        .map(|b| ALPHABET[(*b % 32) as usize] as char)
        .collect()
}

/// A share link's id: 16 characters of the same alphabet (80 random bits).
pub fn new_link_id() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes
        .iter()
        .map(|b| ALPHABET[(*b % 32) as usize] as char)
        .collect()
}

/// Whether `id` has the shape of an id this runner generates.
pub fn is_session_id(id: &str) -> bool {
    id.len() == SESSION_ID_LEN && id.bytes().all(|b| matches!(b, b'a'..=b'z' | b'2'..=b'7'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_shape_is_the_alphabet_and_the_length() {
        for b in 0..=u8::MAX {
            let id = format!("abcdefghijk{}", b as char);
            assert_eq!(is_session_id(&id), ALPHABET.contains(&b), "{b}");
        }
        assert!(!is_session_id("abcdefghijk"));
        assert!(!is_session_id("abcdefghijklm"));
    }

    #[test]
    fn ids_are_twelve_base32_characters() {
        for _ in 0..1000 {
            let id = new_session_id();
            assert!(is_session_id(&id), "{id}");
        }
    }

    #[test]
    fn ids_do_not_repeat() {
        let ids: std::collections::HashSet<_> = (0..10_000).map(|_| new_session_id()).collect();
        assert_eq!(ids.len(), 10_000);
    }
}
