//! Pod IPs of the host pod network, from the loopback range 127.0.x.y:
//! every address of 127/8 is local on Linux, so two pods can both listen on
//! the same port of their own IP. (The isolated pod network takes its
//! addresses from its bridge's subnet: `podnet`.)

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::sync::OnceLock;

/// 254 × 254 addresses (x, y in 1..=254), skipping 127.0.0.x.
const POOL_SIZE: u32 = 254 * 253;

struct Pool {
    next: u32,
    in_use: HashSet<u32>,
}

/// One pool per process, starting at a random offset, so simulators in one
/// test binary never share an address and those in different binaries
/// rarely do.
fn pool() -> &'static Mutex<Pool> {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        Mutex::new(Pool {
            next: rand::random_range(0..POOL_SIZE),
            in_use: HashSet::new(),
        })
    })
}

fn addr(n: u32) -> Ipv4Addr {
    let x = (n / 254) + 1; // 1..=253
    let y = (n % 254) + 1; // 1..=254
    Ipv4Addr::new(127, 0, x as u8 + 1, y as u8)
}

/// Takes a free pod IP.
pub fn allocate() -> Option<Ipv4Addr> {
    let mut p = pool().lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..POOL_SIZE {
        let n = p.next;
        p.next = (p.next + 1) % POOL_SIZE;
        if p.in_use.insert(n) {
            return Some(addr(n));
        }
    }
    None
}

/// Returns a pod IP to the pool.
pub fn release(ip: Ipv4Addr) {
    let [a, _, x, y] = ip.octets();
    if a != 127 || x < 2 || y == 0 {
        return;
    }
    let n = (u32::from(x) - 2) * 254 + (u32::from(y) - 1);
    pool()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .in_use
        .remove(&n);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_unique_loopback_and_reusable() {
        let a = allocate().expect("free");
        let b = allocate().expect("free");
        assert_ne!(a, b);
        assert!(a.is_loopback() && b.is_loopback());
        assert_ne!(a.octets()[2], 0);
        assert_ne!(a.octets()[2], 1, "127.0.1.x is left to the host");
        release(a);
        release(b);
    }
}
