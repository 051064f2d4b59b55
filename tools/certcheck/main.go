// Command certcheck checks the cert-manager objects in YAML files without a cluster.
//
// A server-side dry run can only check Issuer and Certificate objects on a cluster
// that has cert-manager's CRDs, and the test control plane has none. So this decodes
// every cert-manager.io document strictly into cert-manager's own Go types, where an
// unknown or misspelt field is an error, and then checks the fields cert-manager
// needs before it can issue anything.
//
// Usage: certcheck FILE...
//
// It prints one line per problem, naming the file, the document and the field, and
// exits 1 if there was any.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	cmv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// document is one YAML document of a file, with where it came from for messages.
type document struct {
	path  string
	index int // 1-based position in the file
	data  []byte
	// Read loosely before the strict decode, so that every message can say
	// which object it is about.
	header struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
}

// String names the document as "file#N Kind namespace/name".
func (d document) String() string {
	name := d.header.Metadata.Name
	if d.header.Metadata.Namespace != "" {
		name = d.header.Metadata.Namespace + "/" + name
	}
	return fmt.Sprintf("%s#%d %s %s", d.path, d.index, d.header.Kind, name)
}

// issuerKey identifies an issuer as a Certificate's issuerRef resolves it.
// ClusterIssuers have an empty namespace.
type issuerKey struct {
	kind, namespace, name string
}

// checker collects the problems and what is needed to resolve issuerRefs
// across all the files given, since an Issuer and its Certificate are
// usually in different files.
type checker struct {
	problems []string
	issuers  map[issuerKey]bool
	refs     []issuerRef
	checked  int
}

// issuerRef is a Certificate's reference to an issuer, resolved after all
// documents are read.
type issuerRef struct {
	from document
	key  issuerKey
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: certcheck FILE...")
		os.Exit(2)
	}
	c := &checker{issuers: map[issuerKey]bool{}}
	for _, path := range os.Args[1:] {
		docs, err := readDocuments(path)
		if err != nil {
			c.problem("%s: %v", path, err)
			continue
		}
		for _, doc := range docs {
			c.check(doc)
		}
	}
	c.resolveIssuerRefs()
	// Passing because nothing was looked at would hide a wrong glob.
	if c.checked == 0 && len(c.problems) == 0 {
		c.problem("no cert-manager.io documents in %v", os.Args[1:])
	}
	for _, p := range c.problems {
		fmt.Fprintln(os.Stderr, p)
	}
	if len(c.problems) > 0 {
		os.Exit(1)
	}
	fmt.Printf("certcheck: %d cert-manager object(s) OK\n", c.checked)
}

func (c *checker) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// readDocuments splits a file into its non-empty YAML documents.
func readDocuments(path string) ([]document, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var docs []document
	for index := 1; ; index++ {
		data, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		// A document of only comments or "---" decodes to null: nothing to check.
		asJSON, err := yaml.YAMLToJSON(data)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", index, err)
		}
		if string(asJSON) == "null" {
			continue
		}
		doc := document{path: path, index: index, data: data}
		if err := yaml.Unmarshal(data, &doc.header); err != nil {
			return nil, fmt.Errorf("document %d: %w", index, err)
		}
		docs = append(docs, doc)
	}
}

func (c *checker) check(doc document) {
	tm := doc.header.TypeMeta
	gv, err := schema.ParseGroupVersion(tm.APIVersion)
	if err != nil {
		c.problem("%s: apiVersion: %v", doc, err)
		return
	}
	if gv.Group != cmv1.SchemeGroupVersion.Group {
		return // not ours to check
	}
	c.checked++
	if gv.Version != cmv1.SchemeGroupVersion.Version {
		c.problem("%s: apiVersion %s is not served; use %s", doc, tm.APIVersion, cmv1.SchemeGroupVersion)
		return
	}
	switch tm.Kind {
	case cmv1.IssuerKind:
		var issuer cmv1.Issuer
		if c.decode(doc, &issuer) {
			c.checkIssuer(doc, cmv1.IssuerKind, issuer.ObjectMeta, issuer.Spec)
		}
	case cmv1.ClusterIssuerKind:
		var issuer cmv1.ClusterIssuer
		if c.decode(doc, &issuer) {
			if issuer.Namespace != "" {
				c.problem("%s: metadata.namespace must be empty: ClusterIssuers are cluster-scoped", doc)
			}
			c.checkIssuer(doc, cmv1.ClusterIssuerKind, issuer.ObjectMeta, issuer.Spec)
		}
	case cmv1.CertificateKind:
		var cert cmv1.Certificate
		if c.decode(doc, &cert) {
			c.checkCertificate(doc, &cert)
		}
	default:
		// CertificateRequests and Orders are made by cert-manager, not written by hand.
		c.problem("%s: kind %q of %s is not one certcheck knows", doc, tm.Kind, gv.Group)
	}
}

// decode is strict: an unknown field, a misspelt one or a duplicate key is an error,
// which is what catches a manifest written for another version of the API.
func (c *checker) decode(doc document, into any) bool {
	if err := yaml.UnmarshalStrict(doc.data, into); err != nil {
		c.problem("%s: %v", doc, err)
		return false
	}
	return true
}

func (c *checker) checkIssuer(doc document, kind string, meta metav1.ObjectMeta, spec cmv1.IssuerSpec) {
	if meta.Name == "" {
		c.problem("%s: metadata.name is empty", doc)
	}
	// cert-manager accepts exactly one issuer type; with none it never becomes Ready.
	types := 0
	for _, set := range []bool{
		spec.ACME != nil, spec.CA != nil, spec.Vault != nil,
		spec.SelfSigned != nil, spec.Venafi != nil,
	} {
		if set {
			types++
		}
	}
	switch {
	case types == 0:
		c.problem("%s: spec sets no issuer type (acme, ca, vault, selfSigned or venafi)", doc)
	case types > 1:
		c.problem("%s: spec sets %d issuer types; set exactly one", doc, types)
	}
	if spec.CA != nil && spec.CA.SecretName == "" {
		c.problem("%s: spec.ca.secretName is empty", doc)
	}
	c.issuers[issuerKey{kind: kind, namespace: meta.Namespace, name: meta.Name}] = true
}

func (c *checker) checkCertificate(doc document, cert *cmv1.Certificate) {
	spec := cert.Spec
	if cert.Name == "" {
		c.problem("%s: metadata.name is empty", doc)
	}
	if spec.SecretName == "" {
		c.problem("%s: spec.secretName is empty", doc)
	}
	// cert-manager rejects a Certificate that names no subject at all.
	if spec.CommonName == "" && spec.LiteralSubject == "" && len(spec.DNSNames) == 0 &&
		len(spec.URIs) == 0 && len(spec.IPAddresses) == 0 && len(spec.EmailAddresses) == 0 &&
		len(spec.OtherNames) == 0 {
		c.problem("%s: spec has no commonName, dnsNames or other subject name", doc)
	}
	ref := spec.IssuerRef
	if ref.Name == "" {
		c.problem("%s: spec.issuerRef.name is empty", doc)
		return
	}
	// External issuers (another group) are resolved by their own controllers.
	if ref.Group != "" && ref.Group != cmv1.SchemeGroupVersion.Group {
		return
	}
	key := issuerKey{kind: ref.Kind, namespace: cert.Namespace, name: ref.Name}
	switch ref.Kind {
	case "", cmv1.IssuerKind:
		key.kind = cmv1.IssuerKind // cert-manager's default
	case cmv1.ClusterIssuerKind:
		key.namespace = ""
	default:
		c.problem("%s: spec.issuerRef.kind %q is neither Issuer nor ClusterIssuer", doc, ref.Kind)
		return
	}
	c.refs = append(c.refs, issuerRef{from: doc, key: key})
}

// resolveIssuerRefs reports a Certificate whose Issuer is not among the files:
// such a Certificate would stay un-issued forever, and the webhook with it.
func (c *checker) resolveIssuerRefs() {
	for _, ref := range c.refs {
		if !c.issuers[ref.key] {
			where := ""
			if ref.key.namespace != "" {
				where = " in namespace " + ref.key.namespace
			}
			c.problem("%s: spec.issuerRef names %s %q%s, which is not in the files checked",
				ref.from, ref.key.kind, ref.key.name, where)
		}
	}
}
