// Command etcd runs the etcd server, as go.etcd.io/etcd/v3's main.go does.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
