//! The group's keys in etcd, under its prefix: `leader` (held by the leader's lease), `state`
//! (term and sync set; no lease) and `members/<node>` (each member's own lease).

/// The keys of one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupKeys {
    prefix: String,
}

impl GroupKeys {
    pub fn new(prefix: &str) -> GroupKeys {
        GroupKeys {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }

    pub fn leader(&self) -> Vec<u8> {
        format!("{}/leader", self.prefix).into_bytes()
    }

    pub fn state(&self) -> Vec<u8> {
        format!("{}/state", self.prefix).into_bytes()
    }

    pub fn members(&self) -> Vec<u8> {
        format!("{}/members/", self.prefix).into_bytes()
    }

    pub fn member(&self, node: &str) -> Vec<u8> {
        format!("{}/members/{node}", self.prefix).into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sit_under_the_prefix_and_members_under_their_own() {
        let keys = GroupKeys::new("/twopc/g/");
        assert_eq!(keys.leader(), b"/twopc/g/leader");
        assert_eq!(keys.state(), b"/twopc/g/state");
        assert!(keys.member("a").starts_with(&keys.members()));
    }
}
