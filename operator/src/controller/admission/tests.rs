use super::*;
use api::validate::Refusal;

fn invalid(reason: &str) -> Invalid {
    Invalid { field: "spec".to_owned(), reason: reason.to_owned(), kind: Refusal::ALL[0] }
}

#[test]
fn an_admitted_current_version_is_rendered_remembered_and_recorded() {
    let d = decide(Ok("v2"), Some("v1"), Fit::Admitted);
    assert_eq!(d, Decision { verdict: Ok(()), rendered: Some("v2"), remember: Some("v2"), admitted: true });
}

#[test]
fn over_the_ceiling_the_last_accepted_version_stays_where_it_fits() {
    let why = invalid("over the ceiling");
    let d = decide(Ok("v2"), Some("v1"), Fit::LastAccepted(why.clone()));
    assert_eq!(d, Decision { verdict: Err(why.clone()), rendered: Some("v1"), remember: None, admitted: false });
    let d = decide(Ok("v2"), Some("v1"), Fit::Refused(why.clone()));
    assert_eq!(d, Decision { verdict: Err(why), rendered: None, remember: None, admitted: false });
}

#[test]
fn an_invalid_config_keeps_its_last_accepted_version_unless_it_has_no_room() {
    let why = invalid("bad selector");
    let d = decide(Err(why.clone()), Some("v1"), Fit::Admitted);
    assert_eq!(d, Decision { verdict: Err(why.clone()), rendered: Some("v1"), remember: Some("v1"), admitted: false });
    // Without room it is on no node, but still remembered for the next pass.
    let d = decide(Err(why.clone()), Some("v1"), Fit::Refused(invalid("no room")));
    assert_eq!(d, Decision { verdict: Err(why.clone()), rendered: None, remember: Some("v1"), admitted: false });
    let d = decide::<&str>(Err(why.clone()), None, Fit::Admitted);
    assert_eq!(d, Decision { verdict: Err(why), rendered: None, remember: None, admitted: false });
}

fn node(name: &str, region: Option<&str>) -> Arc<Node> {
    let mut node = Node::default();
    node.metadata.name = Some(name.to_owned());
    if let Some(region) = region {
        node.metadata.labels = Some([(REGION_LABELS[0].to_owned(), region.to_owned())].into());
    }
    Arc::new(node)
}

#[test]
fn the_regions_of_matched_nodes_are_named_by_their_first_node() {
    let nodes =
        [node("a", Some("us-east-1")), node("b", Some("us-east-1")), node("c", None), node("d", Some("eu-west-1"))];
    let fleet = Fleet::new(&nodes);
    let regions = fleet.regions_of(&[1, 0, 2, 3]);
    assert_eq!(regions.len(), 2);
    assert_eq!(regions.get("us-east-1").map(String::as_str), Some("b"));
    assert_eq!(regions.get("eu-west-1").map(String::as_str), Some("d"));
    assert!(fleet.regions_of(&[2]).is_empty());
}
