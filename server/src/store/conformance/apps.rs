//! `AppStore` checks: apps and nonces: write-only secrets and their rotation, and nonces spent
//! once.

use super::*;

pub async fn apps_and_rotation(store: Arc<dyn Store>) {
    // A fresh store answers "no such app", not an error.
    assert_eq!(store.get_app("billing").await.expect("get"), None);
    let app = AppRecord {
        app_id: "billing".into(),
        name: "Billing".into(),
        secrets: vec![AppSecret {
            secret: "whsec_first".into(),
            not_after: 0,
        }],
        created_at: 0,
    };
    let before = now(&store).await;
    let created = store.create_app(app.clone()).await.expect("create app");
    assert!(created.created_at >= before, "{created:?}");
    assert_eq!(created.secrets, app.secrets);
    assert_eq!(
        store.get_app("billing").await.expect("get"),
        Some(created.clone())
    );
    let again = store.create_app(app).await;
    assert!(
        matches!(again, Err(Error::AppExists(ref id)) if id == "billing"),
        "{again:?}"
    );
    assert_eq!(store.get_app("nobody").await.expect("get"), None);
    let missing = store
        .rotate_app_secret("nobody", "whsec_x", Duration::from_secs(1))
        .await;
    assert!(matches!(missing, Err(Error::AppNotFound(_))), "{missing:?}");

    // A rotation: the old secret keeps signing for the overlap, the new one after.
    let t0 = now(&store).await;
    let r = store
        .rotate_app_secret("billing", "whsec_second", Duration::from_secs(60))
        .await
        .expect("rotate");
    let t1 = now(&store).await;
    assert_eq!(r.secrets.len(), 2);
    assert_eq!(r.secrets[1].secret, "whsec_second");
    assert_eq!(r.secrets[1].not_after, 0);
    assert_near(r.secrets[0].not_after, t0, t1, 60_000, "old secret's end");
    let active: Vec<&str> = r.active_secrets(t1).collect();
    assert_eq!(active, ["whsec_first", "whsec_second"]);
    assert_eq!(store.get_app("billing").await.expect("get"), Some(r));
    // No overlap: only the new secret signs from now on; a later rotation drops the
    // ended ones.
    let r = store
        .rotate_app_secret("billing", "whsec_third", Duration::ZERO)
        .await
        .expect("rotate");
    let t2 = now(&store).await;
    let active: Vec<&str> = r.active_secrets(t2 + 1).collect();
    assert_eq!(active, ["whsec_third"]);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let r = store
        .rotate_app_secret("billing", "whsec_fourth", Duration::from_secs(60))
        .await
        .expect("rotate");
    let kept: Vec<&str> = r.secrets.iter().map(|s| s.secret.as_str()).collect();
    assert_eq!(kept, ["whsec_third", "whsec_fourth"]);
    // Debug never shows a secret.
    assert!(!format!("{r:?}").contains("whsec_"), "{r:?}");
}

pub async fn nonces(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(200);
    assert!(store.check_nonce("app-1", "n-1", ttl).await.expect("nonce"));
    assert!(!store.check_nonce("app-1", "n-1", ttl).await.expect("nonce"));
    assert!(store.check_nonce("app-2", "n-1", ttl).await.expect("nonce"));
    assert!(store.check_nonce("app-1", "n-2", ttl).await.expect("nonce"));
    assert!(!store.check_nonce("app-2", "n-1", ttl).await.expect("nonce"));

    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(store.check_nonce("app-1", "n-1", ttl).await.expect("nonce"));
    assert!(!store.check_nonce("app-1", "n-1", ttl).await.expect("nonce"));
}
