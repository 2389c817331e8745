// Package kubetest runs a real Kubernetes control plane for tests: Debian's
// etcd and a kube-apiserver built from source (scripts/build-kube.sh)
// on loopback, with RBAC authorization and service account tokens. No
// kubelet, scheduler or controller-manager runs: Pods are API objects only.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// KubeVersion is the version of the kube-apiserver the tests run; the
// build script builds the same one.
const KubeVersion = "v1.37.2"

// APIServerEnv names a kube-apiserver binary to use instead of the cached
// build.
const APIServerEnv = "SLUICE_KUBE_APISERVER"

// APIServerPath returns where the build script puts kube-apiserver:
// BinDir()/kube-apiserver. $SLUICE_KUBE_APISERVER wins.
func APIServerPath() string {
	if p := os.Getenv(APIServerEnv); p != "" {
		return p
	}
	return filepath.Join(BinDir(), "kube-apiserver")
}

// BinDir is where scripts/build-kube.sh puts the Kubernetes binaries:
// CacheDir()/kube-<version>/bin.
func BinDir() string {
	return filepath.Join(CacheDir(), "kube-"+KubeVersion, "bin")
}

// CacheDir is the folder outside the repository where tools built once
// for the tests are kept.
func CacheDir() string {
	if d := os.Getenv("SLUICE_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "sluice")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "sluice-cache")
	}
	return filepath.Join(home, ".cache", "sluice")
}

// Cluster is a running etcd and kube-apiserver.
type Cluster struct {
	// URL is the API server's address, https://127.0.0.1:PORT.
	URL string
	// CA is the PEM certificate the API server's serving certificate
	// chains to.
	CA []byte
	// Admin is a client configuration with a token in system:masters.
	Admin *rest.Config

	dir        string
	etcd, kas  *exec.Cmd
	etcdExited chan struct{}
	kasExited  chan struct{}
	logs       *syncBuffer
	stopOnce   sync.Once
}

// Start runs etcd and kube-apiserver with their state under dir and
// returns once the API server is ready. The processes' output goes to
// Logs. Stop ends them.
func Start(ctx context.Context, dir string) (*Cluster, error) {
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("etcd: %w (apt-get install etcd-server)", err)
	}
	kasBin := APIServerPath()
	if _, err := os.Stat(kasBin); err != nil {
		return nil, fmt.Errorf("kube-apiserver: %w (run scripts/build-kube.sh)", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, logs: &syncBuffer{}, etcdExited: make(chan struct{}), kasExited: make(chan struct{})}
	clientURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.etcd = exec.Command(etcdBin, "--data-dir", filepath.Join(dir, "etcd"), "--name", "default",
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL, "--log-level", "warn")
	if err := c.startProc(c.etcd, "etcd", c.etcdExited); err != nil {
		return nil, err
	}

	keyFile, pubFile := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := writeSAKeys(keyFile, pubFile); err != nil {
		c.Stop()
		return nil, err
	}
	token := randHex(16)
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(token+`,admin,admin,"system:masters"`+"\n"), 0o600); err != nil {
		c.Stop()
		return nil, err
	}
	certDir := filepath.Join(dir, "certs")
	port := ports[2]
	c.kas = exec.Command(kasBin, "--etcd-servers", clientURL,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", pubFile, "--service-account-signing-key-file", keyFile,
		"--cert-dir", certDir, "--secure-port", strconv.Itoa(port),
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--endpoint-reconciler-type", "none", "--token-auth-file", tokenFile,
		"--authorization-mode", "RBAC", "--service-cluster-ip-range", "10.96.0.0/12,fd00:10:96::/108",
		"--disable-admission-plugins", "ServiceAccount")
	if err := c.startProc(c.kas, "kube-apiserver", c.kasExited); err != nil {
		c.Stop()
		return nil, err
	}
	c.URL = "https://127.0.0.1:" + strconv.Itoa(port)
	if err := c.waitReady(ctx, filepath.Join(certDir, "apiserver.crt")); err != nil {
		c.Stop()
		return nil, fmt.Errorf("%w\n%s", err, c.Logs())
	}
	c.Admin = c.config(token)
	return c, nil
}

func (c *Cluster) startProc(cmd *exec.Cmd, name string, exited chan struct{}) error {
	cmd.Stdout = c.logs
	cmd.Stderr = c.logs
	// Its own process group, so that nothing it starts outlives it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	go func() { _ = cmd.Wait(); close(exited) }()
	return nil
}

// waitReady polls /readyz until it answers ok. The serving certificate is
// written by the API server at start-up, so the CA is read once it exists.
func (c *Cluster) waitReady(ctx context.Context, certFile string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready: %v (last: %v)", ctx.Err(), last)
		case <-c.kasExited:
			return errors.New("kube-apiserver exited during start-up")
		case <-c.etcdExited:
			return errors.New("etcd exited during start-up")
		case <-tick.C:
		}
		if c.CA == nil {
			b, err := os.ReadFile(certFile)
			if err != nil {
				last = err
				continue
			}
			c.CA = b
		}
		rc := c.config("")
		hc, err := rest.HTTPClientFor(rc)
		if err != nil {
			return err
		}
		resp, err := hc.Get(c.URL + "/readyz")
		if err != nil {
			last = err
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		last = fmt.Errorf("/readyz %d: %s", resp.StatusCode, bytes.TrimSpace(body))
	}
}

func (c *Cluster) config(token string) *rest.Config {
	return &rest.Config{Host: c.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: c.CA},
		QPS: 100, Burst: 200}
}

// Logs returns what etcd and kube-apiserver wrote so far.
func (c *Cluster) Logs() string { return c.logs.String() }

// Stop ends kube-apiserver, then etcd, and waits for both.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		for _, p := range []struct {
			cmd    *exec.Cmd
			exited chan struct{}
		}{{c.kas, c.kasExited}, {c.etcd, c.etcdExited}} {
			if p.cmd == nil || p.cmd.Process == nil {
				continue
			}
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(15 * time.Second):
				_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
				<-p.exited
			}
		}
	})
}

// AdminClient returns a clientset with the admin token.
func (c *Cluster) AdminClient() (*kubernetes.Clientset, error) {
	return kubernetes.NewForConfig(c.Admin)
}

// ServiceAccountConfig returns a client configuration that authenticates
// as the service account ns/name with a token the API server issues for it
// (TokenRequest), as the kubelet would mount into its Pods.
func (c *Cluster) ServiceAccountConfig(ctx context.Context, ns, name string) (*rest.Config, error) {
	cs, err := c.AdminClient()
	if err != nil {
		return nil, err
	}
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for service account %s/%s: %w", ns, name, err)
	}
	return c.config(tr.Status.Token), nil
}

// WriteKubeconfig writes a kubeconfig file for rc (server, CA and token).
func WriteKubeconfig(path string, rc *rest.Config) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{Token: rc.BearerToken}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	return clientcmd.WriteToFile(*cfg, path)
}

// EnsureNamespace creates namespace ns if it does not exist.
func (c *Cluster) EnsureNamespace(ctx context.Context, ns string) error {
	cs, err := c.AdminClient()
	if err != nil {
		return err
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", ns, err)
	}
	return nil
}

func freePorts(n int) ([]int, error) {
	var out []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

func writeSAKeys(keyFile, pubFile string) error {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// HelmVersion is the Helm the chart tests and `make manifests` use.
const HelmVersion = "v4.3.2"

// HelmPath returns where scripts/build-helm.sh puts helm; $SLUICE_HELM
// wins.
func HelmPath() string {
	if p := os.Getenv("SLUICE_HELM"); p != "" {
		return p
	}
	return filepath.Join(CacheDir(), "helm-"+HelmVersion, "helm")
}
