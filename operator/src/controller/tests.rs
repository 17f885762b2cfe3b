use super::*;

fn invalid(reason: &str, kind: Refusal) -> Invalid {
    Invalid { field: "spec".to_owned(), reason: reason.to_owned(), kind }
}

#[test]
fn a_verdict_stands_before_the_room_on_the_nodes_is_asked() {
    let refused = invalid("over the policy", Refusal::ALL[0]);
    let no_room = invalid("does not fit", Refusal::ALL[1]);
    assert_eq!(with_room(Ok(()), None), Ok(()));
    assert_eq!(with_room(Ok(()), Some(no_room.clone())), Err(no_room.clone()));
    assert_eq!(with_room(Err(refused.clone()), Some(no_room)), Err(refused.clone()));
    assert_eq!(with_room(Err(refused.clone()), None), Err(refused));
}
