//! What `check` judges from the sample parent's rendering besides the
//! children's schemas: `handOff` paths the template must set, and round
//! trips through every other API version (`versions:`) that must bring the
//! sample back whole. Through `check`'s own pipeline, as `tests_conform`.

use super::tests_conform::{DEPLOYMENT_OK, Dir, rule};

#[test]
fn a_hand_off_path_the_template_sets_is_clean_and_one_it_never_sets_is_an_error() {
    let with = |paths: &str| {
        rule(&DEPLOYMENT_OK.replace(
            "      kind: Deployment\n",
            &format!("      kind: Deployment\n      handOff: {paths}\n"),
        ))
    };
    let dir = Dir::new(&[("app.yaml", &with("[spec.replicas]"))]);
    assert_eq!(dir.check(), Vec::<String>::new());

    let text = with("[spec.replicas, spec.replica]");
    let dir = Dir::new(&[("app.yaml", &text)]);
    let line = text
        .lines()
        .position(|l| l.contains("handOff:"))
        .expect("the line")
        + 1;
    assert_eq!(
        dir.check(),
        [format!(
            "app.yaml:{line}: error: spec.children[0].handOff[1]: handOff `spec.replica`: the template of child `web` never sets it (not in its rendering for the sample parent), so there is nothing to hand off"
        )]
    );

    let dir = Dir::new(&[("app.yaml", &with("[metadata.name, 'spec..x']"))]);
    let found = dir.check();
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0].contains("handOff[0]: `metadata.name` cannot be handed off"),
        "{found:#?}"
    );
    assert!(
        found[1].contains("handOff[1]: `spec..x` is not a field path"),
        "{found:#?}"
    );
}

/// The `app` rule's kind, also served as v1alpha1 (`fromHub` given, and
/// the version's `lossy` list).
fn versioned(from_hub: &str, lossy: &str) -> String {
    rule(DEPLOYMENT_OK).replace(
        "  children:\n",
        &format!(
            "  crd: {{}}
  versions:
    - name: v1alpha1
      toHub: |
        image: {{{{ spec.image | default(\"unknown\") }}}}
        replicas: {{{{ spec.replicas | default(2) }}}}
        debug: {{{{ spec.debug | default(false) }}}}
      fromHub: |
{from_hub}
      lossy: {lossy}
  children:
"
        ),
    )
}

#[test]
fn a_round_trip_through_another_version_must_keep_the_sample_parent_whole() {
    let whole = "        image: {{ spec.image }}\n        replicas: {{ spec.replicas }}\n        debug: {{ spec.debug }}";
    let dir = Dir::new(&[("app.yaml", &versioned(whole, "[]"))]);
    assert_eq!(dir.check(), Vec::<String>::new());

    let without_image = "        replicas: {{ spec.replicas }}\n        debug: {{ spec.debug }}";
    let text = versioned(without_image, "[]");
    let dir = Dir::new(&[("app.yaml", &text)]);
    let line = text
        .lines()
        .position(|l| l.contains("fromHub:"))
        .expect("the line")
        + 1;
    assert_eq!(
        dir.check(),
        [format!(
            "app.yaml:{line}: error: spec.versions[0].fromHub: a round trip v1 -> v1alpha1 -> v1 loses `spec.image` of the sample parent; convert it, or list it in `lossy:`"
        )]
    );
    let dir = Dir::new(&[("app.yaml", &versioned(without_image, "[spec.image]"))]);
    assert_eq!(dir.check(), Vec::<String>::new());
}
