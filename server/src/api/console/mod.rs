//! The web console: a small single-page app served at `/` of the HTTP listener, its
//! files compiled into the binary (`assets/`, no build step, nothing fetched from
//! elsewhere). It is a client of the REST API ([`super::rest`]) like any other: every
//! page is a few `fetch` calls with the operator's bearer token, which the browser keeps
//! in its session storage only, and `GET /api/v1/whoami` tells it whether the token may
//! write (a read-only token is shown no button that would) and whether the server is in
//! dev mode (no credentials configured: a banner says so).
//!
//! The files are open (they hold no data); what they show comes through the REST API's
//! auth. Each answer carries a Content-Security-Policy that allows scripts, styles and
//! connections to this origin only.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// One file of the console.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

/// Every file the console is made of; `/` is the page.
const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_str!("assets/index.html"),
    },
    Asset {
        path: "/console/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/app.js"),
    },
    Asset {
        path: "/console/app.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("assets/app.css"),
    },
    Asset {
        path: "/console/favicon.svg",
        content_type: "image/svg+xml",
        body: include_str!("assets/favicon.svg"),
    },
];

/// What the browser may load and call from a console page: this origin only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; \
    frame-ancestors 'none'";

/// The console's routes (`/` and `/console/*`), open: they serve files, not data.
pub fn router() -> axum::Router {
    ASSETS.iter().fold(axum::Router::new(), |router, asset| {
        router.route(asset.path, get(move || async move { serve(asset) }))
    })
}

fn serve(asset: &'static Asset) -> Response {
    let mut resp = asset.body.into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // The files change with the binary: revalidate rather than keep an old app.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_the_page_names_is_served() {
        let page = ASSETS[0].body;
        for asset in &ASSETS[1..] {
            assert!(
                page.contains(&format!("\"{}\"", asset.path)),
                "index.html does not load {}",
                asset.path
            );
        }
        // Nothing from another origin: no CDN, no external fonts (the SVG namespace is
        // a name, not a fetch).
        for asset in ASSETS {
            let body = asset
                .body
                .replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
            assert!(
                !body.contains("https://") && !body.contains("http://"),
                "{} names another origin",
                asset.path
            );
        }
    }

    #[test]
    fn the_page_has_no_inline_script_the_policy_would_block() {
        let page = ASSETS[0].body;
        for (i, _) in page.match_indices("<script") {
            let tag = &page[i..page[i..].find('>').map_or(page.len(), |e| i + e)];
            assert!(tag.contains("src="), "inline script in index.html: {tag}");
        }
        assert!(!page.contains(" style=\""), "inline style in index.html");
        assert!(!page.contains(" onclick="), "inline handler in index.html");
    }
}
