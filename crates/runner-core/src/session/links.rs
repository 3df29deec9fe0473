//! A session's share links: each opens one port through the edge to
//! whoever holds its URL, until it expires or is revoked. The URL itself is
//! signed and checked without this list; the list is what makes a link
//! revocable (a pass naming a link that is not listed opens nothing).
//!
//! Where a session outlives the runner process, its backend keeps the list
//! too ([`KeptLink`], `Backend::keep_links`): a change is made only once it
//! is kept, so the next runner lists and honours exactly the links this one
//! did, and a revoked link stays revoked.

use std::sync::Mutex;

pub use crate::launch::KeptLink;
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

impl From<&ShareLink> for KeptLink {
    fn from(link: &ShareLink) -> Self {
        Self {
            id: link.id.clone(),
            port: link.port,
            expires_at: link.expires_at,
            created_at: link.created_at.clone(),
        }
    }
}

/// A session's live share links.
#[derive(Debug, Default)]
pub struct ShareLinks {
    links: Mutex<Vec<ShareLink>>,
    /// Held while a change is being kept: changes are made one at a time,
    /// each on the list the last one left.
    changing: tokio::sync::Mutex<()>,
}

/// A session already holds [`MAX_LINKS`] unexpired links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyLinks;

impl ShareLinks {
    /// Held for the whole of a change that is kept before it is made.
    pub async fn change(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.changing.lock().await
    }

    /// The list as it would be with `link` added at `now` (expired ones
    /// left out), for keeping before [`Self::add`].
    pub fn with_added(&self, link: &ShareLink, now: u64) -> Result<Vec<KeptLink>, TooManyLinks> {
        let links = lock(&self.links);
        let mut kept: Vec<KeptLink> = links
            .iter()
            .filter(|kept| kept.expires_at > now)
            .map(KeptLink::from)
            .collect();
        if kept.len() >= MAX_LINKS {
            return Err(TooManyLinks);
        }
        kept.push(KeptLink::from(link));
        Ok(kept)
    }

    /// The list as it would be without link `id` (expired ones left out),
    /// or `None` when there is no such link.
    pub fn without(&self, id: &str, now: u64) -> Option<Vec<KeptLink>> {
        let links = lock(&self.links);
        links.iter().any(|kept| kept.id == id).then(|| {
            links
                .iter()
                .filter(|kept| kept.id != id && kept.expires_at > now)
                .map(KeptLink::from)
                .collect()
        })
    }

    /// Takes the links a previous runner kept (boot), each with its URL
    /// made again by `url_of`; expired ones are left out.
    pub fn restore(&self, kept: Vec<KeptLink>, now: u64, url_of: impl Fn(&KeptLink) -> String) {
        let mut links = lock(&self.links);
        for link in kept.into_iter().filter(|link| link.expires_at > now) {
            if links.len() >= MAX_LINKS || links.iter().any(|held| held.id == link.id) {
                continue;
            }
            links.push(ShareLink {
                url: url_of(&link),
                id: link.id,
                port: link.port,
                expires_at: link.expires_at,
                created_at: link.created_at,
            });
        }
    }

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

    #[test]
    fn a_change_is_described_before_it_is_made_and_restored_as_kept() {
        let links = ShareLinks::default();
        links.add(link("old", 5), 0).expect("added");
        links.add(link("a", 100), 0).expect("added");
        let kept = links.with_added(&link("b", 200), 10).expect("room");
        assert_eq!(
            kept.iter().map(|l| l.id.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(links.list(0).len(), 2, "nothing changed yet");
        assert_eq!(links.without("missing", 10), None);
        assert_eq!(links.without("a", 10), Some(Vec::new()));

        let next = ShareLinks::default();
        next.restore(kept, 150, |l| format!("url-{}", l.id));
        let restored = next.list(150);
        assert_eq!(restored.len(), 1, "the expired one is left out");
        assert_eq!(restored[0].id, "b");
        assert_eq!(restored[0].url, "url-b");
    }
}
