package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// pkiFiles names the PEM files written by writePKI.
type pkiFiles struct {
	caFile, servingCert, servingKey, adminCert, adminKey, saKey, saPub string
	caPEM, adminCertPEM, adminKeyPEM                                   []byte
	// With a node: its kubelet's client certificate (CN system:node:NAME,
	// O system:nodes), what the Node authorizer recognises.
	kubeletCertPEM, kubeletKeyPEM []byte
}

// writePKI generates, with ECDSA P-256 keys (fast to make): a CA, a serving
// certificate for 127.0.0.1/localhost, an admin client certificate
// (CN=admin, O=system:masters) and a service-account signing key pair. With a
// node name: the serving certificate also names nodeIP (where pods reach the
// API server) and a client certificate for that node's kubelet is made.
func writePKI(dir string, nodeIP net.IP, nodeName string) (*pkiFiles, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pkiFiles{
		caFile:      filepath.Join(dir, "ca.crt"),
		servingCert: filepath.Join(dir, "apiserver.crt"),
		servingKey:  filepath.Join(dir, "apiserver.key"),
		adminCert:   filepath.Join(dir, "admin.crt"),
		adminKey:    filepath.Join(dir, "admin.key"),
		saKey:       filepath.Join(dir, "sa.key"),
		saPub:       filepath.Join(dir, "sa.pub"),
	}
	now := time.Now().Add(-time.Hour)
	tmpl := func(cn string, org ...string) *x509.Certificate {
		serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
		return &x509.Certificate{
			SerialNumber: serial,
			Subject:      pkix.Name{CommonName: cn, Organization: org},
			NotBefore:    now,
			NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		}
	}

	caKey, caKeyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	ca := tmpl("controlplane-ca")
	ca.IsCA, ca.BasicConstraintsValid = true, true
	ca.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	caPEM, err := sign(ca, ca, caKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	caCert, _ := x509.ParseCertificate(mustDecode(caPEM))
	p.caPEM = caPEM

	serving := tmpl("kube-apiserver")
	serving.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	serving.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	serving.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback, net.ParseIP("10.0.0.1")}
	if nodeIP != nil {
		serving.IPAddresses = append(serving.IPAddresses, nodeIP)
	}
	servingKey, servingKeyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	servingPEM, err := sign(serving, caCert, servingKey.Public(), caKey)
	if err != nil {
		return nil, err
	}

	admin := tmpl("admin", "system:masters")
	admin.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	adminKey, adminKeyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	adminPEM, err := sign(admin, caCert, adminKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	p.adminCertPEM, p.adminKeyPEM = adminPEM, adminKeyPEM

	if nodeName != "" {
		kubelet := tmpl("system:node:"+nodeName, "system:nodes")
		kubelet.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		key, keyPEM, err := newKey()
		if err != nil {
			return nil, err
		}
		if p.kubeletCertPEM, err = sign(kubelet, caCert, key.Public(), caKey); err != nil {
			return nil, err
		}
		p.kubeletKeyPEM = keyPEM
	}

	saKey, saKeyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}

	for path, data := range map[string][]byte{
		p.caFile:                     caPEM,
		filepath.Join(dir, "ca.key"): caKeyPEM,
		p.servingCert:                servingPEM,
		p.servingKey:                 servingKeyPEM,
		p.adminCert:                  adminPEM,
		p.adminKey:                   adminKeyPEM,
		p.saKey:                      saKeyPEM,
		p.saPub:                      pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER}),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func newKey() (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func sign(cert, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) ([]byte, error) {
	der, err := x509.CreateCertificate(rand.Reader, cert, parent, pub, signer)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func mustDecode(pemData []byte) []byte {
	b, _ := pem.Decode(pemData)
	return b.Bytes
}

// writeKubeconfig writes a self-contained admin kubeconfig (certificates
// embedded), so it stays valid wherever it is copied.
func writeKubeconfig(path, server string, p *pkiFiles) error {
	return writeClientKubeconfig(path, server, p, "admin", p.adminCertPEM, p.adminKeyPEM)
}

// writeClientKubeconfig writes a self-contained kubeconfig for one client
// certificate.
func writeClientKubeconfig(path, server string, p *pkiFiles, user string, certPEM, keyPEM []byte) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["controlplane"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: p.caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts["controlplane"] = &clientcmdapi.Context{Cluster: "controlplane", AuthInfo: user, Namespace: "default"}
	cfg.CurrentContext = "controlplane"
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*cfg, path)
}
