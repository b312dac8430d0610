// Command hello proves a Pod on the real node reaches the apiserver: it GETs /version
// through the `kubernetes` Service (KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT, the
// Service's cluster IP) with the Pod's service-account token, verifying the server with
// the service-account CA, prints the answer and exits 0; any failure exits 1.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

const account = "/var/run/secrets/kubernetes.io/serviceaccount/"

func run() error {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return fmt.Errorf("KUBERNETES_SERVICE_HOST/PORT not set")
	}
	token, err := os.ReadFile(account + "token")
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(account + "ca.crt")
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("no certificate in %sca.crt", account)
	}
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	url := "https://" + net.JoinHostPort(host, port) + "/version"
	request, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	request.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	response, err := client.Do(request)
	if err != nil {
		return err
	}
	defer response.Body.Close()
	body, err := io.ReadAll(response.Body)
	if err != nil {
		return err
	}
	if response.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, response.Status, body)
	}
	fmt.Printf("GET %s: %s\n%s\n", url, response.Status, body)
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "hello:", err)
		os.Exit(1)
	}
}
