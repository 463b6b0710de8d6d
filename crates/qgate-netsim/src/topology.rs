//! A network described as data — named hosts and links — and the [`World`] built from it: the
//! one way experiments, plans, benchmarks and tests assemble a simulated network.
//!
//! Link parameters in a description use the units people write (Mbit/s, ms); a [`LinkChange`]
//! has the same fields, all optional, and serves both per-direction overrides and timed changes.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};

pub use qgate_link::{LinkChange, QueueSpec};

use crate::{Direction, HostId, LinkId, LinkParams, NetError, Network};

/// A network: hosts, and point-to-point links between them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// The hosts.
    #[serde(default)]
    pub hosts: Vec<HostSpec>,
    /// The links, in order (a link's auto-assigned addresses follow its position).
    #[serde(default)]
    pub links: Vec<LinkSpec>,
}

impl Topology {
    /// Whether packets from host `from` can reach host `to`: a chain of links through hosts
    /// that forward (the route the simulator would find), checked by name before anything is
    /// built.
    pub fn connects(&self, from: &str, to: &str) -> bool {
        let forwards = |h: &str| self.hosts.iter().any(|x| x.name == h && x.forwarding);
        let mut seen = vec![from];
        let mut i = 0;
        while i < seen.len() {
            let h = seen[i];
            i += 1;
            if h != from && !forwards(h) {
                continue;
            }
            for l in &self.links {
                for (near, far) in [(&l.a, &l.b), (&l.b, &l.a)] {
                    if near == h && !seen.contains(&far.as_str()) {
                        if far == to {
                            return true;
                        }
                        seen.push(far);
                    }
                }
            }
        }
        false
    }
}

/// A host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    /// Its name, unique in the topology.
    pub name: String,
    /// Whether it forwards packets between its interfaces (a router).
    #[serde(default)]
    pub forwarding: bool,
}

/// A point-to-point link between two hosts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// Its name, unique in the topology.
    pub name: String,
    /// One end's host.
    pub a: String,
    /// The other end's host.
    pub b: String,
    /// The address of the interface on `a` (default 10.N/16's .1, N = the link's number).
    pub a_addr: Option<IpAddr>,
    /// The address of the interface on `b` (default the same /24's .2).
    pub b_addr: Option<IpAddr>,
    /// Both directions (per-direction fields below override them).
    #[serde(flatten)]
    pub both: LinkChange,
    /// Overrides for the a → b direction.
    pub a_to_b: Option<LinkChange>,
    /// Overrides for the b → a direction.
    pub b_to_a: Option<LinkChange>,
}

impl LinkSpec {
    /// A link with the same parameters both ways.
    pub fn new(name: &str, a: &str, b: &str, both: LinkChange) -> LinkSpec {
        LinkSpec {
            name: name.into(),
            a: a.into(),
            b: b.into(),
            a_addr: None,
            b_addr: None,
            both,
            a_to_b: None,
            b_to_a: None,
        }
    }

    /// The parameters of one direction.
    pub fn params(&self, dir: Direction) -> Result<LinkParams, String> {
        let over = match dir {
            Direction::AtoB => &self.a_to_b,
            Direction::BtoA => &self.b_to_a,
        };
        let change = match over {
            Some(o) => self.both.then(o),
            None => self.both.clone(),
        };
        let mut p = LinkParams::default();
        change.apply(&mut p)?;
        Ok(p)
    }
}

/// Which directions of a link a change touches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Directions {
    /// Both.
    #[default]
    Both,
    /// a → b only.
    AToB,
    /// b → a only.
    BToA,
}

impl Directions {
    /// The directions it names.
    pub fn list(self) -> &'static [Direction] {
        match self {
            Directions::Both => &[Direction::AtoB, Direction::BtoA],
            Directions::AToB => &[Direction::AtoB],
            Directions::BToA => &[Direction::BtoA],
        }
    }
}

/// Why a topology could not be built; the message names the host or link.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// Two hosts or two links share a name.
    #[error("{0} '{1}' is defined twice")]
    Duplicate(&'static str, String),
    /// A link names a host that does not exist.
    #[error("link '{link}': no host named '{host}'")]
    NoSuchHost {
        /// The link.
        link: String,
        /// The missing host.
        host: String,
    },
    /// No link of this name.
    #[error("no link named '{0}'")]
    NoSuchLink(String),
    /// A link's parameters are invalid.
    #[error("link '{link}': {problem}")]
    BadLink {
        /// The link.
        link: String,
        /// What is wrong.
        problem: String,
    },
    /// The simulator refused.
    #[error("link '{link}': {source}")]
    Net {
        /// The link.
        link: String,
        /// Why.
        source: NetError,
    },
    /// More links than auto-assigned addresses.
    #[error("more than 65 535 links")]
    TooManyLinks,
}

/// A link as built: its id and each end's host and address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltLink {
    /// The simulator's id.
    pub id: LinkId,
    /// End a: host and interface address.
    pub a: (HostId, IpAddr),
    /// End b: host and interface address.
    pub b: (HostId, IpAddr),
}

/// A simulated network built from a [`Topology`], with its hosts and links by name. More
/// hosts and links may be added (devices, flows' sources); auto-assigned addresses never repeat.
#[derive(Debug)]
pub struct World {
    /// The network.
    pub net: Network,
    hosts: BTreeMap<String, HostId>,
    forwarding: std::collections::BTreeSet<HostId>,
    links: BTreeMap<String, BuiltLink>,
    order: Vec<BuiltLink>,
    next_link: u32,
}

impl World {
    /// An empty world on a network seeded with `seed`.
    pub fn new(seed: u64) -> World {
        World {
            net: Network::new(seed),
            hosts: BTreeMap::new(),
            forwarding: Default::default(),
            links: BTreeMap::new(),
            order: Vec::new(),
            next_link: 1,
        }
    }

    /// Build `topology` on a network seeded with `seed`. Needs a tokio runtime (the network's
    /// clock).
    pub fn build(topology: &Topology, seed: u64) -> Result<World, TopologyError> {
        let mut w = World::new(seed);
        for h in &topology.hosts {
            w.add_host(&h.name, h.forwarding)?;
        }
        for l in &topology.links {
            w.add_link(l)?;
        }
        Ok(w)
    }

    /// Add a host.
    pub fn add_host(&mut self, name: &str, forwarding: bool) -> Result<HostId, TopologyError> {
        if self.hosts.contains_key(name) {
            return Err(TopologyError::Duplicate("host", name.into()));
        }
        let h = self.net.add_host(name);
        self.net.set_forwarding(h, forwarding);
        if forwarding {
            self.forwarding.insert(h);
        }
        self.hosts.insert(name.into(), h);
        Ok(h)
    }

    /// Add a link between two existing hosts.
    pub fn add_link(&mut self, spec: &LinkSpec) -> Result<BuiltLink, TopologyError> {
        let name = &spec.name;
        if self.links.contains_key(name) {
            return Err(TopologyError::Duplicate("link", name.clone()));
        }
        let host = |h: &str| {
            self.hosts
                .get(h)
                .copied()
                .ok_or_else(|| TopologyError::NoSuchHost {
                    link: name.clone(),
                    host: h.into(),
                })
        };
        let (ha, hb) = (host(&spec.a)?, host(&spec.b)?);
        let bad = |problem: String| TopologyError::BadLink {
            link: name.clone(),
            problem,
        };
        let fwd = spec.params(Direction::AtoB).map_err(bad)?;
        let rev = spec.params(Direction::BtoA).map_err(bad)?;
        let n = self.next_link;
        if n > 0xffff {
            return Err(TopologyError::TooManyLinks);
        }
        self.next_link += 1;
        let auto = |last: u8| IpAddr::V4(Ipv4Addr::new(10, (n >> 8) as u8, n as u8, last));
        let (aa, ba) = (
            spec.a_addr.unwrap_or(auto(1)),
            spec.b_addr.unwrap_or(auto(2)),
        );
        let net_err = |source: NetError| TopologyError::Net {
            link: name.clone(),
            source,
        };
        let ia = self.net.add_interface(ha, aa).map_err(net_err)?;
        let ib = self.net.add_interface(hb, ba).map_err(net_err)?;
        let id = self.net.connect(ia, ib, fwd, rev).map_err(net_err)?;
        let built = BuiltLink {
            id,
            a: (ha, aa),
            b: (hb, ba),
        };
        self.links.insert(name.clone(), built);
        self.order.push(built);
        Ok(built)
    }

    /// The host called `name`.
    pub fn host(&self, name: &str) -> Option<HostId> {
        self.hosts.get(name).copied()
    }

    /// The link called `name`.
    pub fn link(&self, name: &str) -> Result<BuiltLink, TopologyError> {
        self.links
            .get(name)
            .copied()
            .ok_or_else(|| TopologyError::NoSuchLink(name.into()))
    }

    /// The address of `host` on its first link (in the order links were added).
    pub fn address_of(&self, host: HostId) -> Option<IpAddr> {
        self.order.iter().find_map(|l| {
            if l.a.0 == host {
                Some(l.a.1)
            } else if l.b.0 == host {
                Some(l.b.1)
            } else {
                None
            }
        })
    }

    /// The address of `target` that `from` should send to: `target`'s end of the last link on
    /// a shortest path from `from` through forwarding hosts (the path the simulator routes).
    /// A multi-homed server's replies leave by the interface of the address they come from, so
    /// a client must use the address facing it. None if no path leads there.
    pub fn address_toward(&self, target: HostId, from: HostId) -> Option<IpAddr> {
        if target == from {
            return self.address_of(target);
        }
        let mut seen = std::collections::BTreeSet::from([from]);
        let mut frontier = vec![from];
        while !frontier.is_empty() {
            let mut next = Vec::new();
            for &h in &frontier {
                if h != from && !self.forwarding.contains(&h) {
                    continue;
                }
                for l in &self.order {
                    for (near, far) in [(l.a, l.b), (l.b, l.a)] {
                        if near.0 != h || !seen.insert(far.0) {
                            continue;
                        }
                        if far.0 == target {
                            return Some(far.1);
                        }
                        next.push(far.0);
                    }
                }
            }
            frontier = next;
        }
        None
    }

    /// The link whose end has address `ip`, and the direction in which that end transmits:
    /// a host's radio on the path it uses.
    pub fn link_at(&self, ip: IpAddr) -> Option<(LinkId, Direction)> {
        self.order.iter().find_map(|l| {
            if l.a.1 == ip {
                Some((l.id, Direction::AtoB))
            } else if l.b.1 == ip {
                Some((l.id, Direction::BtoA))
            } else {
                None
            }
        })
    }

    /// Change the named link now.
    pub fn change(
        &self,
        link: &str,
        dirs: Directions,
        change: &LinkChange,
    ) -> Result<(), TopologyError> {
        let l = self.link(link)?;
        for &d in dirs.list() {
            let mut p = self.net.params(l.id, d);
            change
                .apply(&mut p)
                .map_err(|problem| TopologyError::BadLink {
                    link: link.into(),
                    problem,
                })?;
            self.net
                .set_params(l.id, d, p)
                .map_err(|source| TopologyError::Net {
                    link: link.into(),
                    source,
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LossModel;
    use qgate_aqm::DisciplineSpec;
    use std::time::Duration;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
    }

    fn parse(s: &str) -> Topology {
        toml::from_str(s).unwrap()
    }

    #[test]
    fn a_multi_homed_host_is_addressed_by_the_link_facing_the_sender() {
        rt().block_on(async {
            let t = parse(
                r#"
                hosts = [{ name = "s" }, { name = "r", forwarding = true }, { name = "c" }, { name = "d" }, { name = "x" }]
                links = [
                  { name = "one", a = "s", b = "r" },
                  { name = "two", a = "d", b = "s" },
                  { name = "three", a = "c", b = "r" },
                  { name = "four", a = "x", b = "d" },
                ]
                "#,
            );
            let w = World::build(&t, 1).unwrap();
            let h = |n: &str| w.host(n).unwrap();
            let end = |l: &str, b: bool| {
                let l = w.link(l).unwrap();
                if b { l.b.1 } else { l.a.1 }
            };
            // Through the router: s's end of link one; directly: s's end of link two.
            assert_eq!(w.address_toward(h("s"), h("c")), Some(end("one", false)));
            assert_eq!(w.address_toward(h("s"), h("d")), Some(end("two", true)));
            assert_eq!(w.address_toward(h("c"), h("s")), Some(end("three", false)));
            // d does not forward: nothing reaches s from x.
            assert_eq!(w.address_toward(h("s"), h("x")), None);
            assert!(t.connects("c", "s") && t.connects("x", "d") && !t.connects("x", "s"));
        });
    }

    #[test]
    fn builds_named_hosts_and_links_with_per_direction_overrides() {
        let t = parse(
            r#"
            hosts = [{ name = "a" }, { name = "r", forwarding = true }, { name = "b" }]
            [[links]]
            name = "access"
            a = "a"
            b = "r"
            rate_mbps = 50
            delay_ms = 1
            [[links]]
            name = "bottleneck"
            a = "r"
            b = "b"
            rate_mbps = 10
            delay_ms = 50
            queue = "pie:limit=500"
            b_to_a = { loss = { kind = "bernoulli", p = 0.01 }, queue = { kind = "droptail" } }
            "#,
        );
        rt().block_on(async {
            let w = World::build(&t, 1).unwrap();
            let b = w.link("bottleneck").unwrap();
            assert_eq!(b.a.1, "10.0.2.1".parse::<IpAddr>().unwrap());
            assert_eq!(b.b.1, "10.0.2.2".parse::<IpAddr>().unwrap());
            let fwd = w.net.params(b.id, Direction::AtoB);
            let rev = w.net.params(b.id, Direction::BtoA);
            assert_eq!(fwd.rate_bps, Some(10_000_000));
            assert_eq!(fwd.delay, Duration::from_millis(50));
            assert_eq!(fwd.queue, "pie:limit=500".parse().unwrap());
            assert_eq!(fwd.loss, LossModel::None);
            assert_eq!(rev.loss, LossModel::Bernoulli { p: 0.01 });
            assert_eq!(rev.queue, DisciplineSpec::default());
            assert_eq!(rev.delay, Duration::from_millis(50));
            w.change(
                "bottleneck",
                Directions::AToB,
                &LinkChange {
                    up: Some(false),
                    delay_ms: Some(80.0),
                    ..Default::default()
                },
            )
            .unwrap();
            let fwd = w.net.params(b.id, Direction::AtoB);
            assert!(!fwd.up);
            assert_eq!(fwd.delay, Duration::from_millis(80));
            assert!(w.net.params(b.id, Direction::BtoA).up);
        });
    }

    #[test]
    fn errors_name_the_host_or_link() {
        let dup = parse("hosts = [{ name = \"a\" }, { name = \"a\" }]");
        let missing =
            parse("hosts = [{ name = \"a\" }]\nlinks = [{ name = \"l\", a = \"a\", b = \"zz\" }]");
        let bad = parse(
            "hosts = [{ name = \"a\" }, { name = \"b\" }]\nlinks = [{ name = \"l\", a = \"a\", b = \"b\", delay_ms = -1 }]",
        );
        let queue = parse(
            "hosts = [{ name = \"a\" }, { name = \"b\" }]\nlinks = [{ name = \"l\", a = \"a\", b = \"b\", queue = \"fifo\" }]",
        );
        rt().block_on(async {
            let e = |t: &Topology| World::build(t, 1).unwrap_err().to_string();
            assert_eq!(e(&dup), "host 'a' is defined twice");
            assert_eq!(e(&missing), "link 'l': no host named 'zz'");
            assert!(e(&bad).starts_with("link 'l': delay_ms:"), "{}", e(&bad));
            assert!(e(&queue).contains("fifo"), "{}", e(&queue));
            let w = World::build(&Topology::default(), 1).unwrap();
            assert_eq!(w.link("x").unwrap_err().to_string(), "no link named 'x'");
        });
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = toml::from_str::<Topology>(
            "links = [{ name = \"l\", a = \"a\", b = \"b\", dealy_ms = 5 }]",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("dealy_ms"), "{e}");
    }
}
