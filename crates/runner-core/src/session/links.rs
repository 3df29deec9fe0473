//! A session's share links: each opens one port through the edge to
//! whoever holds its URL, until it expires or is revoked. The URL itself is
//! signed and checked without this list; the list is what makes a link
//! revocable (a pass naming a link that is not listed opens nothing).

use std::sync::Mutex;

use crate::sync::lock;

/// The most links one session keeps (expired ones are forgotten first).
pub const MAX_LINKS: usize = 64;

/// One share link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareLink {
    pub id: String,
    pub port: u16,
    pub url: String,
    /// Unix seconds.
    pub expires_at: u64,
    pub created_at: String,
}

/// A session's live share links.
#[derive(Debug, Default)]
pub struct ShareLinks {
    links: Mutex<Vec<ShareLink>>,
}

/// A session already holds [`MAX_LINKS`] unexpired links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyLinks;

impl ShareLinks {
    /// Keeps `link`, forgetting the links expired at `now`.
    pub fn add(&self, link: ShareLink, now: u64) -> Result<(), TooManyLinks> {
        let mut links = lock(&self.links);
        links.retain(|kept| kept.expires_at > now);
        if links.len() >= MAX_LINKS {
            return Err(TooManyLinks);
        }
        links.push(link);
        Ok(())
    }

    /// The links unexpired at `now`, oldest first.
    pub fn list(&self, now: u64) -> Vec<ShareLink> {
        let mut links = lock(&self.links);
        links.retain(|kept| kept.expires_at > now);
        links.clone()
    }

    /// Revokes link `id`; whether there was one.
    pub fn revoke(&self, id: &str) -> bool {
        let mut links = lock(&self.links);
        let before = links.len();
        links.retain(|kept| kept.id != id);
        links.len() != before
    }

    /// Whether link `id` is listed and unexpired at `now`.
    pub fn is_live(&self, id: &str, now: u64) -> bool {
        lock(&self.links)
            .iter()
            .any(|kept| kept.id == id && kept.expires_at > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(id: &str, expires_at: u64) -> ShareLink {
        ShareLink {
            id: id.into(),
            port: 8080,
            url: format!("http://8080-s.localhost/?telo_access={id}"),
            expires_at,
            created_at: "2026-01-01T00:00:00.000Z".into(),
        }
    }

    #[test]
    fn a_link_lives_until_it_expires_or_is_revoked() {
        let links = ShareLinks::default();
        links.add(link("a", 100), 0).expect("added");
        links.add(link("b", 200), 0).expect("added");
        assert!(links.is_live("a", 99));
        assert!(!links.is_live("a", 100));
        assert!(links.revoke("b"));
        assert!(!links.revoke("b"));
        assert!(!links.is_live("b", 0));
        assert_eq!(links.list(0).len(), 1);
        assert!(links.list(150).is_empty());
    }

    #[test]
    fn a_session_keeps_a_bounded_number_and_expired_ones_make_room() {
        let links = ShareLinks::default();
        for n in 0..MAX_LINKS {
            links.add(link(&n.to_string(), 10), 0).expect("room");
        }
        assert_eq!(links.add(link("over", 10), 0), Err(TooManyLinks));
        links
            .add(link("later", 20), 10)
            .expect("the expired made room");
        assert_eq!(links.list(10).len(), 1);
    }
}
