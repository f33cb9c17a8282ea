// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3 at the
// version pinned in ../versions.env (upstream's own main is in the
// go.etcd.io/etcd/v3 root module, which cannot be installed with replace-free
// `go build`; this wrapper is equivalent).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
