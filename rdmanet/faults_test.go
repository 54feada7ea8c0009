package rdmanet_test

// childRoles are the extra peer roles of fault tests (see childMain).
var childRoles = map[string]func(){}
