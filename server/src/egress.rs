//! Outbound address policy: which addresses the server's own HTTP calls (HTTP job
//! targets, webhooks) may reach, checked on the resolved address at connect time.
//!
//! Checking the URL's host name alone is not enough: a name can resolve to a private
//! or metadata address, and resolve differently between a check and the connect (DNS
//! rebinding). So the check lives in the DNS resolver the HTTP client connects with
//! ([`PolicyResolver`]): refused addresses are dropped and never connected to. reqwest
//! does not call the resolver for IP-literal hosts, so [`EgressPolicy::check_url`] must
//! run before each request as well; [`client_builder`] installs the rest (resolver, no
//! redirects, no proxies).
//!
//! The rules, per use:
//! - **Webhooks** ([`EgressPolicy::webhooks`]): public addresses, plus the allow list.
//! - **HTTP targets** ([`EgressPolicy::http_targets`]): public and private addresses
//!   (RFC 1918, shared/CGNAT `100.64.0.0/10`, IPv6 ULA `fc00::/7`), plus the allow list.
//!   Loopback is *not* allowed by default for targets either: on the server's own host
//!   it reaches the server's admin ports and, often, its Redis.
//! - Neither reaches link-local (`169.254.0.0/16`, `fe80::/10`), cloud metadata
//!   endpoints, loopback, unspecified, multicast or documentation/reserved addresses
//!   unless the address is on the allow list.
//!
//! An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) and a NAT64 address
//! (`64:ff9b::a.b.c.d`) are classified by the IPv4 address they carry.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

pub use ipnet::IpNet;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("egress to {ip} refused: it is a {class} address, not allowed for {purpose}")]
    Refused {
        ip: IpAddr,
        class: AddressClass,
        purpose: Purpose,
    },
    #[error("egress to {host} refused: every address it resolves to is refused ({})", list(.refused))]
    AllRefused {
        host: String,
        refused: Vec<(IpAddr, AddressClass)>,
    },
    #[error("cannot resolve {host}: {source}")]
    Lookup {
        host: String,
        source: std::io::Error,
    },
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
    #[error("egress refused: scheme {0:?} is not http or https")]
    Scheme(String),
    #[error("egress refused: the URL has no host")]
    NoHost,
    #[error(
        "allow-list entry {entry:?} is not an address or CIDR (like 10.0.0.0/8, 127.0.0.1, fd00::/8)"
    )]
    BadAllowEntry { entry: String },
}

fn list(refused: &[(IpAddr, AddressClass)]) -> String {
    refused
        .iter()
        .map(|(ip, class)| format!("{ip}: {class}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What an address is, as far as egress is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    Public,
    /// RFC 1918, IPv6 unique-local (`fc00::/7`) and the deprecated site-local `fec0::/10`.
    Private,
    /// Shared address space `100.64.0.0/10` (carrier-grade NAT, and some cloud VPCs).
    SharedCgnat,
    Loopback,
    LinkLocal,
    /// A cloud instance-metadata endpoint (credentials live there).
    Metadata,
    /// `0.0.0.0/8` and `::` (connecting to them reaches the local host).
    Unspecified,
    Multicast,
    /// Documentation, benchmarking, IETF-assigned and future-use ranges, broadcast.
    Reserved,
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddressClass::Public => "public",
            AddressClass::Private => "private",
            AddressClass::SharedCgnat => "shared (CGNAT)",
            AddressClass::Loopback => "loopback",
            AddressClass::LinkLocal => "link-local",
            AddressClass::Metadata => "metadata",
            AddressClass::Unspecified => "unspecified",
            AddressClass::Multicast => "multicast",
            AddressClass::Reserved => "documentation/reserved",
        })
    }
}

/// Which kind of call a policy governs (named in refusals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Webhooks,
    HttpTargets,
}

impl fmt::Display for Purpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Purpose::Webhooks => "webhooks",
            Purpose::HttpTargets => "HTTP targets",
        })
    }
}

/// Which addresses one kind of outbound call may reach.
#[derive(Debug, Clone)]
pub struct EgressPolicy {
    purpose: Purpose,
    /// Reached whatever their class (tests allow-list loopback; operators their
    /// internal webhook receivers).
    allow: Vec<IpNet>,
}

impl EgressPolicy {
    /// Public addresses, plus `allow`.
    pub fn webhooks(allow: Vec<IpNet>) -> Self {
        Self {
            purpose: Purpose::Webhooks,
            allow,
        }
    }

    /// Public and private addresses (not loopback), plus `allow`.
    pub fn http_targets(allow: Vec<IpNet>) -> Self {
        Self {
            purpose: Purpose::HttpTargets,
            allow,
        }
    }

    pub fn purpose(&self) -> Purpose {
        self.purpose
    }

    /// Whether `ip` may be connected to.
    pub fn permit(&self, ip: IpAddr) -> Result<(), Error> {
        let canonical = canonical(ip);
        if self
            .allow
            .iter()
            .any(|net| net.contains(&ip) || net.contains(&canonical))
        {
            return Ok(());
        }
        let class = classify(ip);
        let allowed = match class {
            AddressClass::Public => true,
            AddressClass::Private | AddressClass::SharedCgnat => {
                self.purpose == Purpose::HttpTargets
            }
            _ => false,
        };
        if allowed {
            Ok(())
        } else {
            Err(Error::Refused {
                ip,
                class,
                purpose: self.purpose,
            })
        }
    }

    /// Refuses URLs that are not http(s), and IP-literal hosts outside the policy (the
    /// resolver never sees those). Host names pass here; the resolver checks them.
    pub fn check_url(&self, url: &url::Url) -> Result<(), Error> {
        match url.scheme() {
            "http" | "https" => {}
            other => return Err(Error::Scheme(other.to_owned())),
        }
        match url.host() {
            None => Err(Error::NoHost),
            Some(url::Host::Ipv4(ip)) => self.permit(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.permit(IpAddr::V6(ip)),
            Some(url::Host::Domain(_)) => Ok(()),
        }
    }

    /// Resolves `host` and keeps the addresses this policy permits (port 0: the client
    /// puts in the URL's). Fails naming the host and every refused address when none
    /// is left.
    pub async fn resolve(&self, host: &str) -> Result<Vec<SocketAddr>, Error> {
        let found: Vec<SocketAddr> = tokio::net::lookup_host((host, 0))
            .await
            .map_err(|source| Error::Lookup {
                host: host.to_owned(),
                source,
            })?
            .collect();
        if found.is_empty() {
            return Err(Error::NoAddress {
                host: host.to_owned(),
            });
        }
        let mut permitted = Vec::with_capacity(found.len());
        let mut refused = Vec::new();
        for addr in found {
            match self.permit(addr.ip()) {
                Ok(()) => permitted.push(addr),
                Err(_) => refused.push((addr.ip(), classify(addr.ip()))),
            }
        }
        if permitted.is_empty() {
            return Err(Error::AllRefused {
                host: host.to_owned(),
                refused,
            });
        }
        if !refused.is_empty() {
            tracing::debug!(host, refused = %list(&refused), "egress: some addresses dropped");
        }
        Ok(permitted)
    }
}

/// Parses a comma-separated allow list of CIDRs (`10.0.0.0/8`) and bare addresses
/// (`127.0.0.1` as /32, `::1` as /128). Empty entries are skipped; a bad one is named.
pub fn parse_allow_list(text: &str) -> Result<Vec<IpNet>, Error> {
    text.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            entry
                .parse::<IpNet>()
                .map(|net| net.trunc())
                .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| Error::BadAllowEntry {
                    entry: entry.to_owned(),
                })
        })
        .collect()
}

/// A reqwest DNS resolver that only hands out addresses `policy` permits.
#[derive(Debug, Clone)]
pub struct PolicyResolver {
    policy: Arc<EgressPolicy>,
}

impl PolicyResolver {
    pub fn new(policy: Arc<EgressPolicy>) -> Self {
        Self { policy }
    }
}

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let addrs = policy.resolve(name.as_str()).await?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// A client builder bound to `policy`: its resolver drops refused addresses, redirects
/// are not followed (a redirect could point anywhere), and proxies from the
/// environment are not used (the proxy would make the connection, unchecked). TLS is
/// rustls. Callers still run [`EgressPolicy::check_url`] before each request.
pub fn client_builder(policy: Arc<EgressPolicy>) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .use_rustls_tls()
        .dns_resolver(Arc::new(PolicyResolver::new(policy)))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
}

/// The egress refusal behind a failed request, if that is why it failed.
pub fn refusal<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Error> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(found) = e.downcast_ref::<Error>()
            && matches!(found, Error::Refused { .. } | Error::AllRefused { .. })
        {
            return Some(found);
        }
        cur = e.source();
    }
    None
}

/// The address as connected to: IPv4-mapped IPv6 becomes its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// The class of `ip`; IPv4-mapped and NAT64 IPv6 addresses by their IPv4 address.
pub fn classify(ip: IpAddr) -> AddressClass {
    match canonical(ip) {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    use AddressClass::*;
    // Metadata endpoints first: they sit inside ranges that are otherwise allowed.
    // 169.254.169.254: AWS, GCP, Azure, OpenStack, Oracle and most others;
    // 100.100.100.200: Alibaba Cloud (inside the CGNAT range targets may reach);
    // 168.63.129.16: Azure's WireServer (a public address, but only inside Azure).
    const METADATA: [[u8; 4]; 3] = [
        [169, 254, 169, 254],
        [100, 100, 100, 200],
        [168, 63, 129, 16],
    ];
    if METADATA.contains(&ip.octets()) {
        return Metadata;
    }
    let table: &[([u8; 4], u32, AddressClass)] = &[
        ([0, 0, 0, 0], 8, Unspecified),
        ([127, 0, 0, 0], 8, Loopback),
        ([10, 0, 0, 0], 8, Private),
        ([172, 16, 0, 0], 12, Private),
        ([192, 168, 0, 0], 16, Private),
        ([100, 64, 0, 0], 10, SharedCgnat),
        ([169, 254, 0, 0], 16, LinkLocal),
        ([192, 0, 0, 0], 24, Reserved),    // IETF protocol assignments
        ([192, 0, 2, 0], 24, Reserved),    // TEST-NET-1
        ([198, 51, 100, 0], 24, Reserved), // TEST-NET-2
        ([203, 0, 113, 0], 24, Reserved),  // TEST-NET-3
        ([198, 18, 0, 0], 15, Reserved),   // benchmarking
        ([192, 88, 99, 0], 24, Reserved),  // 6to4 relay anycast (deprecated)
        ([224, 0, 0, 0], 4, Multicast),
        ([240, 0, 0, 0], 4, Reserved), // future use, and 255.255.255.255 broadcast
    ];
    table
        .iter()
        .find(|(net, prefix, _)| in_v4(ip, *net, *prefix))
        .map_or(Public, |(_, _, class)| *class)
}

fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    use AddressClass::*;
    // AWS's IPv6 metadata endpoint, inside the unique-local range targets may reach.
    const AWS_METADATA: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254);
    if ip == AWS_METADATA {
        return Metadata;
    }
    if ip.is_unspecified() {
        return Unspecified;
    }
    if ip.is_loopback() {
        return Loopback;
    }
    let s = ip.segments();
    // NAT64 well-known prefix 64:ff9b::/96: a gateway forwards to the IPv4 address.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [a, b] = s[6].to_be_bytes();
        let [c, d] = s[7].to_be_bytes();
        return classify_v4(Ipv4Addr::new(a, b, c, d));
    }
    match s[0] {
        x if x & 0xffc0 == 0xfe80 => LinkLocal,
        x if x & 0xffc0 == 0xfec0 => Private, // site-local (deprecated)
        x if x & 0xfe00 == 0xfc00 => Private, // unique local
        x if x & 0xff00 == 0xff00 => Multicast,
        0x2001 if s[1] == 0x0db8 => Reserved, // documentation
        0x2001 if s[1] < 0x0200 => Reserved,  // IETF protocol assignments (incl. Teredo)
        0x3fff if s[1] < 0x1000 => Reserved,  // documentation (RFC 9637)
        x if x & 0xe000 == 0x2000 => Public,  // global unicast 2000::/3
        _ => Reserved,                        // IPv4-compatible, discard-only 100::/64, unassigned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    fn nets(s: &str) -> Vec<IpNet> {
        parse_allow_list(s).expect("test allow list")
    }

    /// (address, class, allowed for webhooks, allowed for HTTP targets) with empty
    /// allow lists.
    const TABLE: &[(&str, AddressClass, bool, bool)] = {
        use AddressClass::*;
        &[
            ("8.8.8.8", Public, true, true),
            ("1.1.1.1", Public, true, true),
            ("2606:4700::1111", Public, true, true),
            ("::ffff:8.8.8.8", Public, true, true),
            ("10.1.2.3", Private, false, true),
            ("172.16.0.1", Private, false, true),
            ("172.31.255.255", Private, false, true),
            ("172.32.0.1", Public, true, true),
            ("192.168.1.1", Private, false, true),
            ("::ffff:10.0.0.1", Private, false, true),
            ("fd12:3456::1", Private, false, true),
            ("fc00::1", Private, false, true),
            ("100.64.0.1", SharedCgnat, false, true),
            ("100.127.255.254", SharedCgnat, false, true),
            ("100.128.0.1", Public, true, true),
            ("127.0.0.1", Loopback, false, false),
            ("127.8.9.10", Loopback, false, false),
            ("::1", Loopback, false, false),
            ("::ffff:127.0.0.1", Loopback, false, false),
            ("169.254.169.254", Metadata, false, false),
            ("::ffff:169.254.169.254", Metadata, false, false),
            ("64:ff9b::a9fe:a9fe", Metadata, false, false),
            ("fd00:ec2::254", Metadata, false, false),
            ("100.100.100.200", Metadata, false, false),
            ("169.254.1.1", LinkLocal, false, false),
            ("fe80::1", LinkLocal, false, false),
            ("febf::1", LinkLocal, false, false),
            ("0.0.0.0", Unspecified, false, false),
            ("0.1.2.3", Unspecified, false, false),
            ("::", Unspecified, false, false),
            ("::ffff:0.0.0.0", Unspecified, false, false),
            ("224.0.0.1", Multicast, false, false),
            ("ff02::1", Multicast, false, false),
            ("255.255.255.255", Reserved, false, false),
            ("240.0.0.1", Reserved, false, false),
            ("192.0.2.1", Reserved, false, false),
            ("198.51.100.7", Reserved, false, false),
            ("203.0.113.9", Reserved, false, false),
            ("198.18.0.1", Reserved, false, false),
            ("2001:db8::1", Reserved, false, false),
            ("::127.0.0.1", Reserved, false, false),
            ("64:ff9b::808:808", Public, true, true),
        ]
    };

    #[test]
    fn addresses_are_classified_and_permitted_per_policy() {
        let webhooks = EgressPolicy::webhooks(vec![]);
        let targets = EgressPolicy::http_targets(vec![]);
        for &(addr, class, for_webhooks, for_targets) in TABLE {
            let a = ip(addr);
            assert_eq!(classify(a), class, "{addr}");
            assert_eq!(webhooks.permit(a).is_ok(), for_webhooks, "webhooks {addr}");
            assert_eq!(targets.permit(a).is_ok(), for_targets, "targets {addr}");
        }
    }

    #[test]
    fn refusals_name_the_address_and_class() {
        let err = EgressPolicy::http_targets(vec![])
            .permit(ip("169.254.169.254"))
            .expect_err("metadata");
        let text = err.to_string();
        assert!(
            text.contains("169.254.169.254") && text.contains("metadata"),
            "{text}"
        );
        let err = EgressPolicy::webhooks(vec![])
            .permit(ip("10.0.0.1"))
            .expect_err("private");
        let text = err.to_string();
        assert!(
            text.contains("10.0.0.1") && text.contains("private"),
            "{text}"
        );
    }

    #[test]
    fn the_allow_list_reaches_anything_listed_and_only_that() {
        let webhooks = EgressPolicy::webhooks(nets("127.0.0.0/8, 10.0.0.5"));
        assert!(webhooks.permit(ip("127.0.0.1")).is_ok());
        assert!(webhooks.permit(ip("127.1.2.3")).is_ok());
        assert!(webhooks.permit(ip("::ffff:127.0.0.1")).is_ok(), "mapped");
        assert!(webhooks.permit(ip("10.0.0.5")).is_ok());
        assert!(webhooks.permit(ip("10.0.0.6")).is_err());
        assert!(webhooks.permit(ip("::1")).is_err(), "::1 is not 127/8");
        assert!(webhooks.permit(ip("169.254.169.254")).is_err());

        let targets = EgressPolicy::http_targets(nets("::1,169.254.169.254/32,fd00:ec2::254"));
        assert!(targets.permit(ip("::1")).is_ok());
        assert!(targets.permit(ip("127.0.0.1")).is_err());
        assert!(
            targets.permit(ip("169.254.169.254")).is_ok(),
            "explicitly listed"
        );
        assert!(targets.permit(ip("169.254.169.253")).is_err());
        assert!(
            targets.permit(ip("fd00:ec2::254")).is_ok(),
            "explicitly listed"
        );
    }

    #[test]
    fn allow_lists_parse_cidrs_and_bare_addresses_and_name_bad_entries() {
        assert_eq!(
            nets("127.0.0.0/8,127.0.0.1, ::1 ,fd00::/8,,10.1.2.3/8"),
            vec![
                "127.0.0.0/8".parse::<IpNet>().expect("net"),
                "127.0.0.1/32".parse().expect("net"),
                "::1/128".parse().expect("net"),
                "fd00::/8".parse().expect("net"),
                "10.0.0.0/8".parse().expect("net"),
            ]
        );
        assert_eq!(nets(""), vec![]);
        for bad in [
            "localhost",
            "10.0.0.0/33",
            "::1/129",
            "1.2.3",
            "10.0.0.0/",
            "*",
        ] {
            let err = parse_allow_list(&format!("127.0.0.1,{bad}")).expect_err(bad);
            assert!(
                matches!(&err, Error::BadAllowEntry { entry } if entry == bad),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn urls_are_checked_for_scheme_and_ip_literal_hosts() {
        let targets = EgressPolicy::http_targets(vec![]);
        let check = |u: &str| targets.check_url(&url::Url::parse(u).expect("test url"));
        assert!(
            check("https://example.com/x").is_ok(),
            "names go to the resolver"
        );
        assert!(check("http://8.8.8.8/").is_ok());
        assert!(check("http://10.0.0.1:8080/").is_ok());
        assert!(check("http://127.0.0.1:8080/").is_err());
        assert!(check("http://[::1]/").is_err());
        assert!(check("http://[::ffff:169.254.169.254]/").is_err());
        assert!(check("http://169.254.169.254/latest/meta-data/").is_err());
        assert!(
            check("http://0x7f.1/").is_err(),
            "the URL parser normalises 127.0.0.1"
        );
        assert!(check("http://0/").is_err());
        assert!(matches!(check("ftp://8.8.8.8/"), Err(Error::Scheme(s)) if s == "ftp"));
        assert!(matches!(check("file:///etc/passwd"), Err(Error::Scheme(_))));
    }

    #[tokio::test]
    async fn the_resolver_drops_refused_addresses() {
        let refused = EgressPolicy::webhooks(vec![])
            .resolve("localhost")
            .await
            .expect_err("loopback is refused");
        match &refused {
            Error::AllRefused { host, refused } => {
                assert_eq!(host, "localhost");
                assert!(!refused.is_empty());
                assert!(refused.iter().all(|(_, c)| *c == AddressClass::Loopback));
            }
            other => panic!("{other}"),
        }
        assert!(refused.to_string().contains("localhost"), "{refused}");

        let v4_only = EgressPolicy::http_targets(nets("127.0.0.0/8"));
        let addrs = v4_only.resolve("localhost").await.expect("allow-listed");
        assert!(!addrs.is_empty());
        assert!(
            addrs.iter().all(|a| a.ip() == ip("127.0.0.1")),
            "::1 (if localhost has it) is dropped: {addrs:?}"
        );

        let both = EgressPolicy::http_targets(nets("127.0.0.0/8,::1"));
        let all = tokio::net::lookup_host(("localhost", 0))
            .await
            .expect("localhost resolves")
            .count();
        assert_eq!(both.resolve("localhost").await.expect("allowed").len(), all);

        // ::1 through the resolver, whether or not this host's "localhost" has it.
        let err = v4_only.resolve("::1").await.expect_err("::1 is not 127/8");
        assert!(
            matches!(&err, Error::AllRefused { refused, .. }
                if refused == &[(ip("::1"), AddressClass::Loopback)]),
            "{err}"
        );
        assert_eq!(
            both.resolve("::1").await.expect("listed"),
            vec![SocketAddr::new(ip("::1"), 0)]
        );
    }

    #[tokio::test]
    async fn a_client_from_the_builder_never_connects_to_a_refused_address() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let accepted = tokio::spawn(async move { listener.accept().await });

        let policy = Arc::new(EgressPolicy::http_targets(vec![]));
        let client = client_builder(policy.clone()).build().expect("client");
        let url = format!("http://localhost:{port}/");
        let err = client.get(&url).send().await.expect_err("refused");
        let why = refusal(&err).expect("the refusal is in the error chain");
        assert!(matches!(why, Error::AllRefused { host, .. } if host == "localhost"));

        let literal = url::Url::parse(&format!("http://127.0.0.1:{port}/")).expect("url");
        assert!(policy.check_url(&literal).is_err());

        // The first connection the listener sees must be this one.
        let sentinel = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let (_, peer) = accepted.await.expect("accept task").expect("accept");
        assert_eq!(
            peer,
            sentinel.local_addr().expect("addr"),
            "nothing else connected"
        );
    }
}
