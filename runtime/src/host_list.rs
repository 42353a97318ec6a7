//! URLs that name several hosts (`scheme://[userinfo@]h1:p1,h2:p2/path`):
//! a Redis Sentinel group or Cluster, a Postgres primary and its standbys.
//! The `url` crate refuses such an authority, so it is split here, and
//! each host gets a one-host URL of its own for its client crate to parse.

/// The part after `scheme://` of a URL whose authority lists several
/// hosts: `[userinfo@]h1[:p1],h2[:p2]/path`.
pub struct HostList<'a> {
    /// `user:password` as written (percent-encoded), when given.
    pub userinfo: Option<&'a str>,
    /// Every `(host, port)`, in order; IPv6 addresses without brackets.
    pub hosts: Vec<(String, u16)>,
    /// What follows the hosts, without its leading `/` (query included).
    pub path: &'a str,
}

impl<'a> HostList<'a> {
    /// Splits `rest` (the URL after `scheme://`), giving hosts without a
    /// port `default_port`.
    ///
    /// # Errors
    ///
    /// What is wrong, in words: an empty host (a stray comma), a port that
    /// is not a number, an unclosed IPv6 bracket.
    pub fn parse(rest: &'a str, default_port: u16) -> Result<Self, String> {
        // The authority ends at the first '/' or '?'; userinfo is before its
        // last '@' (a password may hold '@' only percent-encoded, but be
        // lenient as libpq is).
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(authority_end);
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        let hosts = hosts
            .split(',')
            .map(|h| parse_host(h.trim(), default_port))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            userinfo,
            hosts,
            path: path.trim_start_matches('/'),
        })
    }

    /// `{scheme}://[userinfo@]host:port/{path}`: a one-host URL for one of
    /// the hosts, which a client crate parses (percent-decoding the
    /// credentials).
    pub fn url_for(&self, scheme: &str, (host, port): &(String, u16), path: &str) -> String {
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        match self.userinfo {
            Some(u) => format!("{scheme}://{u}@{host}:{port}/{path}"),
            None => format!("{scheme}://{host}:{port}/{path}"),
        }
    }
}

/// `url`'s scheme and hosts when its authority names more than one host
/// (a comma in it); `None` for a one-host URL or one without `://`.
///
/// # Errors
///
/// As [`HostList::parse`] (inside the `Some`).
pub fn several(url: &str, default_port: u16) -> Option<Result<(&str, HostList<'_>), String>> {
    let (scheme, rest) = url.split_once("://")?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    if !rest[..authority_end].contains(',') {
        return None;
    }
    Some(HostList::parse(rest, default_port).map(|list| (scheme, list)))
}

/// For a URL naming several hosts, the same URL with only its first, to
/// read its parameters with the `url` crate; `None` otherwise.
pub fn first_host_url(url: &str) -> Option<String> {
    let (scheme, list) = several(url, 0)?.ok()?;
    let first = list.hosts.first()?;
    Some(list.url_for(scheme, first, list.path))
}

fn parse_host(h: &str, default_port: u16) -> Result<(String, u16), String> {
    if h.is_empty() {
        return Err("an empty host in the host list (check for a stray comma)".into());
    }
    let (host, port) = if let Some(v6) = h.strip_prefix('[') {
        let Some((host, after)) = v6.split_once(']') else {
            return Err(format!("host {h:?}: an IPv6 address needs its closing ']'"));
        };
        (host, after.strip_prefix(':'))
    } else {
        match h.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (h, None),
        }
    };
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| format!("host {h:?}: the port {p:?} is not a number from 1 to 65535"))?,
    };
    if host.is_empty() {
        return Err(format!("host {h:?} has no host name"));
    }
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_parse_with_default_ports_and_ipv6() {
        let l = HostList::parse("u:p%40ss@a,b:7001,[::1]:7002/mymaster/2", 26379)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.userinfo, Some("u:p%40ss"));
        assert_eq!(
            l.hosts,
            vec![
                ("a".to_owned(), 26379),
                ("b".to_owned(), 7001),
                ("::1".to_owned(), 7002)
            ]
        );
        assert_eq!(l.path, "mymaster/2");
    }

    #[test]
    fn the_first_host_stands_for_a_list_in_url_checks() {
        assert_eq!(
            first_host_url("postgres://u@a:1,b:2/db?sslmode=require").as_deref(),
            Some("postgres://u@a:1/db?sslmode=require")
        );
        assert_eq!(first_host_url("postgres://u@a:1/db"), None);
    }

    #[test]
    fn one_host_urls_keep_the_credentials_and_the_path() {
        let l = HostList::parse("u:p@a:1,b/db?x=1", 5432).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            l.url_for("postgres", &l.hosts[1], l.path),
            "postgres://u:p@b:5432/db?x=1"
        );
    }
}
