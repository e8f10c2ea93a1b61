// Command etcd is a thin wrapper around etcd's own entry point. The etcd
// repository's root module replaces its sibling modules with local paths, so
// it cannot be built straight from the module proxy; this wrapper requires
// go.etcd.io/etcd/server/v3 at the version Kubernetes pins and calls the same
// function the upstream etcd binary's main calls.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
