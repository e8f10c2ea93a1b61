// trellis-app: the tiny web app the tests and the quickstart run as a webapp
// parent's Deployment child, so readiness is real. Static, no shell, nonroot.
//
//	app                      serve HTTP on $PORT (default 8080): / says $MESSAGE, /healthz ok
//	app dial HOST:PORT [S]   exit 0 if a TCP connection opens within S seconds (default 3)
//
// SIGTERM (what the kubelet sends) ends it at once, so a Pod's deletion does
// not wait for its grace period.
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "dial" {
		os.Exit(dial(os.Args[2:]))
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	message := os.Getenv("MESSAGE")
	if message == "" {
		message = "hello from trellis-app"
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, message) })
	srv := &http.Server{Addr: ":" + port, Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	fmt.Printf("trellis-app listening on :%s\n", port)
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("trellis-app: stopped")
}

func dial(args []string) int {
	if len(args) < 1 {
		fmt.Fprintln(os.Stderr, "usage: app dial HOST:PORT [SECONDS]")
		return 2
	}
	secs := 3
	if len(args) > 1 {
		if n, err := strconv.Atoi(args[1]); err == nil {
			secs = n
		}
	}
	conn, err := net.DialTimeout("tcp", args[0], time.Duration(secs)*time.Second)
	if err != nil {
		fmt.Printf("dial %s: %v\n", args[0], err)
		return 1
	}
	conn.Close()
	fmt.Printf("dial %s: connected\n", args[0])
	return 0
}
