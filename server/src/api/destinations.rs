//! What a job names outside itself, checked before it is saved: a callback URL or an
//! HTTP target the egress policy refuses for certain, and an app that does not exist.
//!
//! "For certain" means an address literal in a range the policy refuses (link-local,
//! cloud metadata, loopback, private for webhooks, ... unless on the allow list): such
//! a URL can never be delivered, so it is refused at create, update and apply with the
//! field named, instead of each delivery failing its whole retry schedule. A host name
//! is checked where it is resolved, at send time (`egress`): what it resolves to may
//! change.

use std::sync::Arc;

use crate::egress::EgressPolicy;
use crate::model::{JobSpec, Target};
use crate::schedule::jobs::Error;
use crate::store::AppStore;

/// The policies and the apps a job spec is checked against.
pub struct Destinations {
    /// Where webhooks (`callback_url`) may go.
    pub webhooks: Arc<EgressPolicy>,
    /// Where HTTP targets may go.
    pub targets: Arc<EgressPolicy>,
    /// The apps a job's `app_id` may name (its webhooks are signed with its secrets).
    pub apps: Arc<dyn AppStore>,
}

impl Destinations {
    /// Refuses a spec naming a destination that can never be reached, or an app that
    /// does not exist, with the field named (`spec.callback_url`, `spec.http.url`,
    /// `spec.app_id`).
    pub async fn check(&self, spec: &JobSpec) -> Result<(), Error> {
        if let Some(url) = &spec.callback_url {
            refused_for_certain(&self.webhooks, "spec.callback_url", url, "--webhook-allow")?;
        }
        if let Target::Http { url, .. } = &spec.target {
            refused_for_certain(&self.targets, "spec.http.url", url, "--http-target-allow")?;
        }
        if !spec.app_id.is_empty() && self.apps.get_app(&spec.app_id).await?.is_none() {
            return Err(Error::Invalid {
                field: "spec.app_id",
                reason: format!(
                    "no app {:?}: create it first (AppService.CreateApp), its secrets sign the job's webhooks",
                    spec.app_id
                ),
            });
        }
        Ok(())
    }
}

fn refused_for_certain(
    policy: &EgressPolicy,
    field: &'static str,
    raw: &str,
    allow_flag: &str,
) -> Result<(), Error> {
    // The URL's shape was checked by `convert`; one that does not parse is its error.
    let Ok(url) = url::Url::parse(raw) else {
        return Ok(());
    };
    policy.check_url(&url).map_err(|e| Error::Invalid {
        field,
        reason: format!(
            "{e}; it could never be delivered (the server's {allow_flag} can allow it)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_literals_in_refused_ranges_are_refused_and_names_are_left_to_send_time() {
        let webhooks = EgressPolicy::webhooks(Vec::new());
        let field = "spec.callback_url";
        for url in [
            "http://10.0.0.1/hook",
            "http://169.254.169.254/latest/meta-data",
            "http://127.0.0.1:9/x",
            "http://[::1]/x",
        ] {
            let e = refused_for_certain(&webhooks, field, url, "--webhook-allow")
                .expect_err(url)
                .to_string();
            assert!(
                e.starts_with("spec.callback_url: egress to ")
                    && e.contains("could never be delivered"),
                "{e}"
            );
        }
        for url in ["https://hooks.example.com/x", "http://93.184.216.34/x"] {
            refused_for_certain(&webhooks, field, url, "--webhook-allow").expect(url);
        }
        let allowed = EgressPolicy::webhooks(vec!["127.0.0.1/32".parse().expect("net")]);
        refused_for_certain(&allowed, field, "http://127.0.0.1:9/x", "--webhook-allow")
            .expect("on the allow list");
        // Targets may reach private addresses, never metadata.
        let targets = EgressPolicy::http_targets(Vec::new());
        refused_for_certain(&targets, "spec.http.url", "http://10.0.0.1/x", "f").expect("private");
        refused_for_certain(&targets, "spec.http.url", "http://169.254.169.254/", "f")
            .expect_err("metadata");
    }
}
